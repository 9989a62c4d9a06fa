"""iris.ccl: collectives written in Triton on Iris's symmetric heap.

Torch semantics, output first: ``all_reduce(out, inp)``, ``all_gather(out, inp)``, ... Any
torch tensor works; tensors on a symmetric heap spanning the collective's group are used
in place, others are staged through a heap of the collective's own.
"""

from ._version import __version__
from .all_reduce import all_reduce
from .config import VARIANTS, Config
from .reduce_op import ReduceOp
from .work import Work

__all__ = ["VARIANTS", "Config", "ReduceOp", "Work", "__version__", "all_reduce"]
