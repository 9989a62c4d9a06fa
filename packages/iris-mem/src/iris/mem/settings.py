"""Settings read from the environment: the one place every Iris package reads them.

Each setting is validated when it is read, with an error naming the variable and what it
accepts. Upper layers (iris.ccl, iris.ops) read their own variables through the typed
readers here (:func:`flag`, :func:`positive_number`, :func:`path`).

Some settings must be read before any kernel is defined:

Triton decides at *decoration* time whether a ``@triton.jit`` function is compiled or
interpreted, so the choice of the CPU backend has to reach Triton before user kernels
(and ours) are defined. Importing :mod:`iris.mem` therefore resolves the backend from the
environment and, for the ``cpu`` backend, turns on Triton's interpreter
(``TRITON_INTERPRET=1``) unless the caller already set ``TRITON_INTERPRET`` explicitly.

Variables
---------
``IRIS_BACKEND``
    ``cpu`` or ``cuda``; unset means ``cuda`` when a CUDA device is visible, else ``cpu``.
``IRIS_DEBUG``
    ``1`` turns on debug checks: every translated pointer is checked in the kernel to fall
    inside the target heap, every rank's allocation sequence is compared on the host, and
    iris.ccl compares every rank's collective arguments before each launch.
``IRIS_WAIT_TIMEOUT``
    Seconds every device-side wait polls before it gives up and reports an error instead of
    hanging (default 300, like ``IRIS_HOST_TIMEOUT``). Measured on the device's own clock
    (``%globaltimer`` on GPUs, the host's monotonic clock in the interpreter), so a peer
    that is late by a JIT compile or a checkpoint is waited for, whatever a poll costs.
``IRIS_HOST_TIMEOUT``
    Seconds a host-side collective of the bootstrap waits (default 300).
``IRIS_WATCHDOG``
    ``0`` turns off the watchdog that aborts a heap when a peer process of the node exits
    (default on; see :mod:`iris.mem.watchdog`).
``IRIS_WATCHDOG_INTERVAL``
    Seconds between the watchdog's looks at the peer processes (default 0.2, at least 0.01).
``IRIS_LOG_LEVEL``
    Level of the ``iris`` logger (a :mod:`logging` level name or number; default WARNING).
``IRIS_NODE_ID``
    Which node this rank is on, for launchers other than torchrun (which sets
    ``GROUP_RANK``): ranks share a node, and a heap, when they run on the same host with the
    same ``IRIS_NODE_ID`` (see :mod:`iris.mem.nodes`).
"""

from __future__ import annotations

import os

import torch  # not triton: importing it must wait until the interpreter is decided

BACKENDS = ("cpu", "cuda")
DEFAULT_WAIT_TIMEOUT = 300.0
_TRUE = {"1", "true", "yes", "on"}


_FALSE = {"0", "false", "no", "off"}


def flag(name: str, default: bool = False) -> bool:
    """The boolean in the environment variable ``name`` (1/true/yes/on or 0/false/no/off,
    any case; ``default`` when unset or blank); a ValueError naming the variable otherwise."""
    value = os.environ.get(name, "").strip().lower()
    if not value:
        return default
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(f"{name}={value!r} is not a boolean; use 1 or 0 (true/false, yes/no, on/off)")


def text(name: str) -> str | None:
    """The stripped value of the environment variable ``name``, or None when unset or blank."""
    return os.environ.get(name, "").strip() or None


def _flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in _TRUE


def _cuda_visible() -> bool:
    return torch.cuda.is_available()  # asks the driver; creates no CUDA context


def requested_backend() -> str | None:
    """The backend named by ``IRIS_BACKEND``, validated, or None."""
    value = os.environ.get("IRIS_BACKEND", "").strip().lower()
    if not value:
        return None
    if value not in BACKENDS:
        raise ValueError(f"IRIS_BACKEND={value!r} is not a backend; use one of {', '.join(BACKENDS)}")
    return value


def default_backend() -> str:
    """The backend used when :func:`iris.mem.init` is given none."""
    return requested_backend() or ("cuda" if _cuda_visible() else "cpu")


def interpreted() -> bool:
    """Whether Triton kernels defined from now on run in Triton's interpreter."""
    return _flag("TRITON_INTERPRET")


def debug() -> bool:
    """Whether ``IRIS_DEBUG`` asks for debug checks (read at every call; exported as
    ``iris.mem.debug_enabled``)."""
    return _flag("IRIS_DEBUG")


def positive_number(name: str, default, convert=float, unit: str = "seconds", minimum=None):
    """The positive, finite number in the environment variable ``name`` read by ``convert``
    (``default`` when it is unset or blank), at least ``minimum`` when given; a ValueError
    naming the variable otherwise."""
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    try:
        number = convert(value)
    except ValueError:
        raise ValueError(f"{name}={value!r} is not a number of {unit}") from None
    if not 0 < number < float("inf"):  # also rejects nan
        raise ValueError(f"{name} must be a positive number of {unit}, got {value!r}")
    if minimum is not None and number < minimum:
        raise ValueError(f"{name} must be at least {minimum} {unit}, got {value!r}")
    return number


def host_timeout() -> float:
    """Seconds a host-side collective waits (``IRIS_HOST_TIMEOUT``, default 300)."""
    return positive_number("IRIS_HOST_TIMEOUT", DEFAULT_WAIT_TIMEOUT)


def watchdog() -> bool:
    """Whether the watchdog runs (``IRIS_WATCHDOG``, default on). Read when a heap is made."""
    return flag("IRIS_WATCHDOG", True)


def watchdog_interval() -> float:
    """Seconds between the watchdog's looks at the peers (``IRIS_WATCHDOG_INTERVAL``,
    default 0.2, at least 0.01)."""
    return positive_number("IRIS_WATCHDOG_INTERVAL", 0.2, minimum=0.01)


def log_level_name() -> str | None:
    """The raw ``IRIS_LOG_LEVEL`` (validated by :func:`iris.mem.log.env_level`), or None."""
    return text("IRIS_LOG_LEVEL")


def launcher_rank() -> tuple[str, str]:
    """``(RANK, WORLD_SIZE)`` as the launcher set them (``"0"``, ``"1"`` without one), for
    log prefixes before torch.distributed is up."""
    return os.environ.get("RANK", "0"), os.environ.get("WORLD_SIZE", "1")


def local_rank() -> int | None:
    """This process's index on its node as the launcher set it (``LOCAL_RANK``), or None."""
    value = text("LOCAL_RANK")
    return None if value is None else int(value)


def local_world_size() -> int | None:
    """How many ranks the launcher started on this node (``LOCAL_WORLD_SIZE``, set by
    torchrun), or None when unset."""
    value = text("LOCAL_WORLD_SIZE")
    return None if value is None else int(value)


def node_id() -> str | None:
    """``IRIS_NODE_ID``: this rank's launcher agent (node) on its host, or None when unset
    (then torchrun's ``GROUP_RANK`` is used)."""
    return text("IRIS_NODE_ID")


def wait_timeout() -> float:
    """Seconds a device-side wait polls before it gives up (``IRIS_WAIT_TIMEOUT``, default
    300). Read at every launch."""
    return positive_number("IRIS_WAIT_TIMEOUT", DEFAULT_WAIT_TIMEOUT)


def wait_budget_ns() -> int:
    """:func:`wait_timeout` in nanoseconds, the ``budget`` argument of every waiting kernel
    (compared with :func:`iris.mem.utils.global_timer` differences); at most 4e18 (127
    years), so it fits the kernels' int64."""
    return max(1, round(min(wait_timeout(), 4e9) * 1e9))


def configure_triton() -> bool:
    """Turn on Triton's interpreter when the backend from the environment is ``cpu`` and the
    caller has not chosen (``TRITON_INTERPRET`` unset). Returns whether it turned it on: then
    Triton's own library functions, if triton was imported already, must be swapped for
    interpreted ones (:func:`iris.mem.triton._compat.interpret_triton_library`)."""
    if "TRITON_INTERPRET" not in os.environ and default_backend() == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
        return True
    return False
