"""Device side of iris.ccl: the :class:`Group` a collective runs over, its barrier, the
tile collectives the host collectives are built from (callable from user kernels), and
:func:`convert`, the reductions' conversion into and out of their fp32 accumulator (float8
included, the same bits compiled and interpreted)."""

from . import accumulate, tiles
from .accumulate import convert
from .group import Group
from .sync import combine, group_sync, record_timeout
from .tiles import (
    all_gather_pull,
    all_gather_push,
    all_reduce_atomic,
    all_reduce_one_shot,
    all_reduce_ring,
    all_reduce_spinlock,
    all_reduce_two_shot,
    all_to_all_pull,
    all_to_all_push,
    broadcast_pull,
    gather_pull,
    reduce_pull,
    reduce_scatter_pull,
    reduce_scatter_push,
    reduce_slots,
    reduce_tile,
    scatter_push,
)

__all__ = [
    "accumulate",
    "tiles",
    "Group",
    "all_gather_pull",
    "all_gather_push",
    "all_reduce_atomic",
    "all_reduce_one_shot",
    "all_reduce_ring",
    "all_reduce_spinlock",
    "all_reduce_two_shot",
    "all_to_all_pull",
    "all_to_all_push",
    "broadcast_pull",
    "combine",
    "convert",
    "gather_pull",
    "group_sync",
    "record_timeout",
    "reduce_pull",
    "reduce_scatter_pull",
    "reduce_scatter_push",
    "reduce_slots",
    "reduce_tile",
    "scatter_push",
]
