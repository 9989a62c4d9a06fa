"""Device side of iris.ccl: the :class:`Group` a collective runs over, its barrier, and
the tile collectives the host collectives are built from (callable from user kernels)."""

from . import tiles
from .group import Group
from .sync import combine, group_sync, record_timeout
from .tiles import (
    all_reduce_atomic,
    all_reduce_one_shot,
    all_reduce_ring,
    all_reduce_spinlock,
    all_reduce_two_shot,
    reduce_tile,
)

__all__ = [
    "tiles",
    "Group",
    "all_reduce_atomic",
    "all_reduce_one_shot",
    "all_reduce_ring",
    "all_reduce_spinlock",
    "all_reduce_two_shot",
    "combine",
    "group_sync",
    "record_timeout",
    "reduce_tile",
]
