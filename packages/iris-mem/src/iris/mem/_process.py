"""Processes of this machine as Linux's ``/proc`` shows them: whether one has ended, and
how. Used by the CPU backend (segments left by killed jobs) and the watchdog (peers that
exited)."""

from __future__ import annotations

import os
import signal
import socket


def pid_namespace() -> str | None:
    """This process's pid namespace (the inode of ``/proc/self/ns/pid``, in hex), or None
    where it cannot be read."""
    try:
        return format(os.stat("/proc/self/ns/pid").st_ino, "x")
    except OSError:
        return None


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of ``/proc/pid/stat`` after the command name (the state is the first),
    or None when the process does not exist; raises OSError when it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return None


def start_time(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot), telling it apart from a later
    process given the same pid; None when it does not exist or cannot be read."""
    try:
        fields = _stat_fields(pid)
    except (OSError, IndexError):
        return None
    return None if fields is None else int(fields[19])


def exited(pid: int, started: int | None = None) -> bool:
    """Whether process ``pid`` of this pid namespace has exited (a zombie has; so has one
    whose pid now names a process started at another time than ``started``)."""
    try:
        fields = _stat_fields(pid)
    except (OSError, IndexError):
        return False  # unreadable: assume it lives
    if fields is None or fields[0] in ("Z", "X"):
        return True
    return started is not None and int(fields[19]) != started


def exit_status(pid: int) -> str | None:
    """How process ``pid`` ended ("exited with code 3", "killed by signal 9 (SIGKILL)"),
    while it is a zombie its parent has not collected yet; None otherwise."""
    try:
        fields = _stat_fields(pid)
        if fields is None or fields[0] != "Z" or len(fields) < 50:
            return None
        status = int(fields[49])
    except (OSError, IndexError, ValueError):
        return None
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        try:
            name = signal.Signals(number).name
        except ValueError:
            name = "unknown signal"
        return f"killed by signal {number} ({name})"
    if os.WIFEXITED(status):
        return f"exited with code {os.WEXITSTATUS(status)}"
    return None


def identity() -> tuple[str, str | None, int, int | None]:
    """``(host, pid namespace, pid, start time)`` of this process: peers with the same host
    and namespace can watch it through ``/proc``."""
    pid = os.getpid()
    return socket.gethostname(), pid_namespace(), pid, start_time(pid)
