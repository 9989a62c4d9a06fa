"""iris.ops: fused GEMM + communication kernels written in Triton on Iris's symmetric heap.

Each op is one persistent Triton kernel in which GEMM tiles are communicated as soon as
they are computed (or fetched just before they are needed), so communication hides under
compute: :func:`matmul_all_reduce`, :func:`all_gather_matmul`, :func:`matmul_all_gather`,
:func:`matmul_reduce_scatter`. Each takes ``group``, ``async_op``, ``config`` (a
:class:`Config`) and a reusable ``workspace`` (a :class:`Workspace`).
:func:`all_reduce_rmsnorm` fuses the all-reduce that ends a tensor-parallel layer with the
residual add and RMSNorm after it (its config: :class:`AllReduceRMSNormConfig`).
:func:`moe_dispatch` and :func:`moe_combine` move mixture-of-experts tokens to the ranks of
their experts and back, one kernel each (their config: :class:`MoEConfig`).
"""

import iris.mem  # noqa: F401 - first: it decides whether Triton kernels are interpreted
from iris.ccl import Work

# Registered at import with iris.ccl.entry: the custom ops and compiled forms, the staged forms.
from . import _hier, _library, _moe_library  # noqa: F401
from ._version import __version__
from .all_gather_matmul import all_gather_matmul
from .all_reduce_rmsnorm import all_reduce_rmsnorm
from .config import AllReduceRMSNormConfig, Config, MoEConfig
from .matmul_all_gather import matmul_all_gather
from .matmul_all_reduce import matmul_all_reduce
from .matmul_reduce_scatter import matmul_reduce_scatter
from .moe import MoEDispatch, check_errors, moe_combine, moe_dispatch
from .workspace import Workspace, release_workspaces, workspace_scope

__all__ = [
    "AllReduceRMSNormConfig",
    "Config",
    "MoEConfig",
    "MoEDispatch",
    "Work",
    "Workspace",
    "__version__",
    "all_gather_matmul",
    "all_reduce_rmsnorm",
    "check_errors",
    "matmul_all_gather",
    "matmul_all_reduce",
    "matmul_reduce_scatter",
    "moe_combine",
    "moe_dispatch",
    "release_workspaces",
    "workspace_scope",
]
