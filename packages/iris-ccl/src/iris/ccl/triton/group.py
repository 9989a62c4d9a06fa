"""``Group`` (defined in :mod:`iris.mem.triton.group`): the device-side view of a collective's
ranks and their sync state."""

from iris.mem.triton.group import Group

__all__ = ["Group"]
