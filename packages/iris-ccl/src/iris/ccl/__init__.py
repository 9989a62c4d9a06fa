"""iris.ccl: collectives written in Triton on Iris's symmetric heap.

Torch semantics, output first: ``all_reduce(out, inp)``, ``all_gather(out, inp)``, ... Any
torch tensor works; tensors on a symmetric heap spanning the collective's group are used
in place, others are staged through a heap of the collective's own.
"""

# Registered at import: the custom ops and their compiled forms, the staged forms over groups
# spanning nodes, the dtypes conversion (each with iris.ccl.entry), the gradients of
# torch.ops.iris and the "iris" torch.distributed backend.
from . import _autograd, _dtypes, _staged, _torch_ops, backend, functional  # noqa: F401
from ._comm import abort, check_errors
from ._version import __version__
from .all_gather import all_gather
from .all_reduce import all_reduce
from .all_to_all import all_to_all
from .barrier import barrier
from .broadcast import broadcast
from .config import VARIANTS, Config
from .gather import gather
from .p2p import recv, send
from .reduce import reduce
from .reduce_op import ReduceOp
from .reduce_scatter import reduce_scatter
from .scatter import scatter
from .work import Work

__all__ = [
    "VARIANTS",
    "Config",
    "ReduceOp",
    "Work",
    "__version__",
    "abort",
    "all_gather",
    "all_reduce",
    "all_to_all",
    "barrier",
    "broadcast",
    "check_errors",
    "gather",
    "recv",
    "reduce",
    "reduce_scatter",
    "scatter",
    "send",
]
