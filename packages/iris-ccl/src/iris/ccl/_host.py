"""Host-side helpers shared by the collectives: validation, staging, launch chunking."""

from __future__ import annotations

import dataclasses
import logging
from collections import Counter
from typing import Any

import torch
import triton

import iris.mem
from iris.mem import AbortedError, CallMismatchError, runtime
from iris.mem.log import get_logger

from . import _comm, variants
from .config import Config, check_config, select
from .reduce_op import ReduceOp, check_dtype, check_op
from .settings import pdl_enabled
from .work import Work

_log = get_logger(__name__)


def check_tensor(t: Any, name: str) -> torch.Tensor:
    """A clear TypeError for non-tensors and unsupported dtypes; an error for a tensor on a
    closed heap (and, in debug mode, in a freed range of a heap) or on an aborted heap."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    check_dtype(t.dtype, name)
    iris.mem.check_live(t, name)
    heap = iris.mem.heap_of(t)
    if heap is not None and heap.aborted:
        # Refused like a closed heap's, whatever the call would do with it (a staged call
        # would only read or write it locally, but nothing may use an aborted heap again).
        try:
            heap.get_device_context()  # raises the heap's own AbortedError: who failed, why
        except AbortedError as e:
            raise AbortedError(
                f"{name} ({list(t.shape)}, {t.dtype}) lies on a symmetric heap that was aborted: {e}",
                e.rank,
                e.reason,
            ) from None
    return t


def check_pair(out: torch.Tensor, inp: torch.Tensor, collective: str, out_numel: int) -> None:
    """``out`` and ``inp`` agree in dtype and device, and ``out`` has ``out_numel`` elements."""
    check_tensor(out, "out")
    check_tensor(inp, "inp")
    if out.dtype != inp.dtype:
        raise TypeError(f"{collective}: out has dtype {out.dtype} but inp has {inp.dtype}; they must match")
    if out.device != inp.device:
        raise ValueError(f"{collective}: out is on {out.device} but inp is on {inp.device}; they must match")
    if out.numel() != out_numel:
        raise ValueError(
            f"{collective}: out has {out.numel()} elements (shape {list(out.shape)}), expected {out_numel} "
            f"for inp of shape {list(inp.shape)}"
        )


def contiguous_pair(inp: torch.Tensor, out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Flat contiguous versions of ``inp`` and ``out``: views when they are contiguous,
    else a copy of ``inp`` and a scratch tensor for ``out`` (see :func:`copy_back`)."""
    src = inp.reshape(-1) if inp.is_contiguous() else inp.contiguous().view(-1)
    dst = (
        out.view(-1) if out.is_contiguous() else torch.empty(out.numel(), dtype=out.dtype, device=out.device)
    )
    return src, dst


def copy_back(out: torch.Tensor, dst: torch.Tensor) -> None:
    """Copy the flat result ``dst`` into a non-contiguous ``out`` (no-op when it is a view)."""
    if not out.is_contiguous():
        out.copy_(dst.view(out.shape))


def acc_fp32(dtype: torch.dtype) -> bool:
    """Whether reductions over ``dtype`` accumulate in fp32 (every floating type)."""
    return dtype.is_floating_point


def acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype.is_floating_point else dtype


def check_consistent(collective: str, group, **fields: Any) -> None:
    """In debug mode (``IRIS_DEBUG=1``), compare the arguments of this collective call across
    the ranks of ``group`` (None: the world) and raise the same ``ValueError`` on every rank
    when they differ, naming the ranks and the fields. A no-op otherwise.

    ``fields`` are picklable values that every rank must pass identically (shapes, dtypes,
    op, variant, root...). The exchange is a host collective over torch.distributed, so it
    also catches ranks that call different collectives at the same point.
    """
    if not iris.mem.debug_enabled():
        return
    signature = {"collective": collective, **fields}
    ranks = runtime.group_ranks(group)
    # ranks at another check (an allocation's, another group's...) are reported as such
    gathered = runtime.exchange(group, "iris.ccl collective", signature, ValueError, names=ranks)
    keys = [repr(sorted(sig.items())) for sig in gathered]
    if len(set(keys)) == 1:
        return
    # The most common signature is the reference (ties: the lowest rank's).
    common = Counter(keys).most_common(1)[0][0]
    reference = gathered[keys.index(common)]
    odd = [r for r, k in zip(ranks, keys) if k != common]
    agree = [r for r, k in zip(ranks, keys) if k == common]
    names = list(dict.fromkeys(name for sig in gathered for name in sig))
    differing = [n for n in names if any(sig.get(n) != reference.get(n) for sig in gathered)]
    details = "; ".join(
        f"{name}: " + ", ".join(f"rank {r} {sig.get(name)!r}" for r, sig in zip(ranks, gathered))
        for name in differing
    )
    raise ValueError(
        f"{reference['collective']} (IRIS_DEBUG): ranks {odd} called it with arguments that differ "
        f"from ranks {agree} in {', '.join(differing)}: {details}. "
        "Every rank of the group must call the same collectives in the same order with the same "
        "shapes, dtypes, op, variant and root, and tensors of the same kind (all on a symmetric heap "
        "spanning the group: 'heap', or none: 'staged')"
    )


def setup(
    collective: str,
    tensors: list[torch.Tensor],
    group,
    config: Config | None,
    nbytes: int,
    stage: bool = False,
    *,
    op: ReduceOp | None = None,
    root: int | None = None,
) -> tuple[_comm.Communicator, bool, Config]:
    """The communicator to run on, whether the tensors are used in place (else they are
    staged through iris.ccl's own heap), and the resolved config (:func:`resolve`, then
    :func:`place`). ``stage`` forces staging."""
    cfg = resolve(collective, tensors, group, config, nbytes, op=op, root=root, stage=stage)
    comm, in_place = place(collective, tensors, group, cfg, nbytes, stage)
    return comm, in_place, cfg


def resolve(
    collective: str,
    tensors: list[torch.Tensor],
    group,
    config: Config | None,
    nbytes: int,
    *,
    op: ReduceOp | None = None,
    root: int | None = None,
    stage: bool = False,
) -> Config:
    """The config to run ``collective`` on ``nbytes`` with (:func:`iris.ccl.config.select`).

    ``tensors`` are the tensors every rank passes; with ``op`` (reductions) and ``root``
    (rooted collectives, a global rank) they make the call's signature, compared across
    ranks in debug mode (:func:`check_consistent`) before anything collective happens, with
    where the call will run (:func:`_kind`; ``stage``: staged whatever the tensors). An
    error of the selection is raised after that comparison, so every rank takes part in it."""
    caps = iris.mem.capabilities(tensors[0].device)
    cfg = failed = None
    try:
        size = len(runtime.group_ranks(group))
        cfg = select(collective, nbytes, size, caps.interpreted, config, caps.device)
    except Exception as e:  # noqa: BLE001 - raised below, after the ranks compared their calls
        failed = e
    if iris.mem.debug_enabled():
        check_consistent(
            collective,
            group,
            shapes=[list(t.shape) for t in tensors],
            dtypes=[str(t.dtype) for t in tensors],
            op=None if op is None else op.name,
            variant=config.variant if isinstance(config, Config) else "auto",
            root=root,
            tensors=_kind(collective, tensors, group, cfg, stage),
        )
    if failed is not None:
        raise failed
    if cfg.programs and not (config is not None and config.programs):
        # programs from the tuning table, maybe measured on a GPU with more SMs: never more
        # than this one keeps resident (a program waiting on a twin that is not scheduled hangs)
        cfg = dataclasses.replace(cfg, programs=min(cfg.programs, caps.resident_programs))
    return cfg


def _kind(collective: str, tensors: list[torch.Tensor], group, cfg: Config | None, stage: bool) -> str:
    """Where a call will run, as the debug check compares it: ``"heap"`` (in place, on the
    heap holding the tensors) or ``"staged"`` (through iris.ccl's own heap: the tensors are
    not on a heap spanning the group, ``stage``, or the variant always stages)."""
    variant = variants.get(collective, cfg.variant) if cfg is not None else None
    if stage or (variant is not None and variant.own_heap(tensors[0].dtype)):
        return "staged"
    return "staged" if _comm.spanning_heap(tensors, group) is None else "heap"


def place(
    collective: str, tensors: list[torch.Tensor], group, cfg: Config, nbytes: int, stage: bool
) -> tuple[_comm.Communicator, bool]:
    """The communicator to run on and whether ``tensors`` are used in place: on the heap
    holding them when it spans ``group`` (see :func:`iris.ccl._comm.in_place`) unless
    ``stage``, else on iris.ccl's own heap for the group."""
    comm = None if stage else _comm.in_place(tensors, group, collective)
    in_place = comm is not None
    if comm is None:
        comm = _comm.own(group, tensors[0].device, collective)
    if _log.isEnabledFor(logging.DEBUG):
        _log.debug("%s: %d bytes, %s, %s", collective, nbytes, "in place" if in_place else "staged", cfg)
    return comm, in_place


def launch(kernel, grid: int, comm: _comm.Communicator, cfg: Config, *args, **meta) -> None:
    """Launch ``kernel`` on the communicator's sync state (:func:`iris.mem.runtime.launch`)
    with the config's tile and warps; kernels with a ``PDL`` constexpr get programmatic
    dependent launch where the device has it, unless ``IRIS_CCL_PDL=0``."""
    if "PDL" in getattr(kernel, "arg_names", ()):
        on = pdl(comm)
        meta = {**meta, "PDL": on, "launch_pdl": on}
    try:
        runtime.launch(
            kernel, grid, comm.sync, *args, programs=resident_programs(comm, cfg), sig=comm.sig,
            BLOCK=cfg.block_size, num_warps=cfg.num_warps, **meta,
        )  # fmt: skip
    except CallMismatchError:
        _comm.discard(comm)  # its sync slots are out of step on the members
        raise


def pdl(comm: _comm.Communicator) -> bool:
    """Whether kernels that start with :func:`~iris.mem.triton.sync.enter_launch` are
    launched with programmatic dependent launch: where the device has it, unless
    ``IRIS_CCL_PDL=0``."""
    return comm.capabilities.pdl and pdl_enabled()


def resident_programs(comm: _comm.Communicator, cfg: Config) -> int:
    """``cfg.programs``, or by default the programs the device keeps resident (one per SM
    on GPUs, 2 in the interpreter): programs waiting on their peers never starve each other."""
    return cfg.programs or comm.capabilities.resident_programs


def persistent_grid(comm: _comm.Communicator, cfg: Config, length: int) -> int:
    """Programs of a persistent kernel over ``length`` elements: :func:`resident_programs`,
    never more than there are tiles."""
    return max(1, min(cdiv(length, cfg.block_size), resident_programs(comm, cfg)))


def vector_hint(tensors, strides_bytes=()) -> int | None:
    """16 when every tensor's address and every byte stride is a multiple of 16 bytes: the
    kernels then re-assert that on translated pointers (``hint=``) so remote accesses stay
    16-byte vectors; None (no assertion, narrower accesses) otherwise."""
    aligned = all(t.data_ptr() % 16 == 0 for t in tensors) and all(s % 16 == 0 for s in strides_bytes)
    return 16 if aligned else None


#: Elements one launch of a persistent kernel may cover (its tile offsets are int32).
MAX_LAUNCH_ELEMENTS = 1 << 30


def chunks(total: int, per_chunk: int):
    """``(start, length)`` pieces of ``range(total)``."""
    for start in range(0, total, per_chunk):
        yield start, min(per_chunk, total - start)


def max_elements(cfg: Config, itemsize: int, staged: bool, comm: _comm.Communicator) -> int:
    """Elements one launch may cover: :data:`MAX_LAUNCH_ELEMENTS` (every kernel is
    persistent, one sync slot per program whatever the size), the config's chunk, and
    (staged) the staging buffer."""
    limit = MAX_LAUNCH_ELEMENTS
    if cfg.chunk_elements:
        limit = min(limit, cfg.chunk_elements)
    if staged:
        limit = min(limit, comm.staging_bytes // itemsize)
    return max(limit, 1)


def finish(comm: _comm.Communicator, async_op: bool) -> Work | None:
    return Work(comm.device) if async_op else None


def cdiv(a: int, b: int) -> int:
    return triton.cdiv(a, b)


def group_position(group) -> tuple[int, int]:
    """``(size, index)``: members of ``group`` (None: the world) and this process's place."""
    ranks, index = runtime.group_index(group)
    return len(ranks), index


def overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether the memory of the contiguous tensors ``a`` and ``b`` overlaps."""
    if a.device != b.device or a.numel() == 0 or b.numel() == 0:
        return False
    a0, b0 = a.data_ptr(), b.data_ptr()
    return a0 < b0 + b.numel() * b.element_size() and b0 < a0 + a.numel() * a.element_size()


__all__ = [
    "ReduceOp",
    "acc_dtype",
    "acc_fp32",
    "cdiv",
    "check_config",
    "check_consistent",
    "check_op",
    "check_pair",
    "check_tensor",
    "chunks",
    "finish",
    "group_position",
    "contiguous_pair",
    "copy_back",
    "launch",
    "max_elements",
    "overlaps",
    "persistent_grid",
    "place",
    "resolve",
    "setup",
    "vector_hint",
]
