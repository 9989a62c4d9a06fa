"""Rank-aware logging for every Iris package, through Python's :mod:`logging`.

``get_logger(__name__)`` returns a logger under the ``iris`` logger, whose handler writes
to stderr with a ``[rank/world]`` prefix::

    [1/3] WARNING iris.mem.tracing: 12 trace events dropped ...

The rank and world size are the torch.distributed ones once a process group exists,
else the launcher's ``RANK``/``WORLD_SIZE``, else ``0/1``.

``IRIS_LOG_LEVEL`` sets the level (``DEBUG``, ``INFO``, ``WARNING`` (default), ``ERROR``,
``CRITICAL``, or a number), read when the first logger is made. To send Iris's records
elsewhere, configure ``logging.getLogger("iris")`` like any logger, or call
:func:`configure`.
"""

from __future__ import annotations

import logging
import sys
from typing import TextIO

import torch.distributed as dist

from . import settings

__all__ = ["configure", "get_logger", "rank_prefix"]

ROOT = "iris"
FORMAT = "%(iris_rank)s %(levelname)s %(name)s: %(message)s"
_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
_handler: logging.Handler | None = None


def rank_prefix() -> str:
    """``[rank/world]`` of this process (see the module docstring for the sources)."""
    if dist.is_available() and dist.is_initialized():
        return f"[{dist.get_rank()}/{dist.get_world_size()}]"
    rank, world = settings.launcher_rank()
    return f"[{rank}/{world}]"


class _RankFilter(logging.Filter):
    """Adds ``iris_rank`` (the ``[rank/world]`` prefix) to every record it passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.iris_rank = rank_prefix()
        return True


def env_level() -> int:
    """The level named by ``IRIS_LOG_LEVEL`` (default WARNING)."""
    value = settings.log_level_name()
    if not value:
        return logging.WARNING
    if value.lstrip("-").isdigit():
        return int(value)
    if value.upper() not in _LEVELS:
        raise ValueError(f"IRIS_LOG_LEVEL={value!r} is not a log level; use one of {', '.join(_LEVELS)}")
    return getattr(logging, value.upper())


def configure(level: int | str | None = None, stream: TextIO | None = None) -> logging.Logger:
    """Set up (or change) the ``iris`` logger's handler and level.

    :param level: a :mod:`logging` level or its name; None reads ``IRIS_LOG_LEVEL``.
    :param stream: where records go; None keeps the current stream (stderr at first).
    :returns: the ``iris`` logger.
    """
    global _handler
    root = logging.getLogger(ROOT)
    if _handler is None:
        _handler = logging.StreamHandler(stream or sys.stderr)
        _handler.addFilter(_RankFilter())
        _handler.setFormatter(logging.Formatter(FORMAT))
        root.addHandler(_handler)
        root.propagate = False  # one line per record, even when the application logs to the root
    elif stream is not None:
        _handler.setStream(stream)
    if isinstance(level, str):
        level = logging.getLevelName(level.upper())
        if not isinstance(level, int):
            raise ValueError(f"unknown log level; use one of {', '.join(_LEVELS)}")
    root.setLevel(env_level() if level is None else level)
    return root


def get_logger(name: str) -> logging.Logger:
    """Logger ``name`` (a module's ``__name__``, under ``iris``) with the Iris handler."""
    if _handler is None:
        configure()
    if name != ROOT and not name.startswith(ROOT + "."):
        name = f"{ROOT}.{name}"
    return logging.getLogger(name)
