"""What the layers above iris.mem may know about the machine their kernels run on.

iris.ccl and iris.ops never ask which backend or device type they run on: they ask
:func:`capabilities` (or ``heap.capabilities``) what the machine can do, and
:func:`synchronize` / :func:`capturing` to wait for or inspect queued work.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import dataclasses
import functools
import threading
import warnings
from collections.abc import Sequence

import torch

from . import settings


@dataclasses.dataclass(frozen=True)
class Capabilities:
    """What kernels on ``device`` can do.

    Attributes:
        device: where the tensors and kernels live.
        backend: the name of the heap backend that serves ``device`` (for
            ``iris.mem.init(backend=...)``; not something to branch on).
        interpreted: kernels run in Triton's interpreter (the ``cpu`` backend): a launch
            returns when the kernel has finished, Gluon and inline assembly are not
            available, and every program runs one after another.
        sm_count: streaming multiprocessors (0 when interpreted).
        compute_capability: ``(major, minor)`` of the GPU, or None when interpreted.
        resident_programs: programs of one launch that are guaranteed to run at the same
            time (one per SM on GPUs, 2 in the interpreter): the most programs a kernel whose
            programs wait for each other (or for peers) may have.
        pdl: programmatic dependent launch is available (compute capability 9 or newer).
        tma: the tensor memory accelerator (tensor descriptors) is available (compute
            capability 9 or newer).
        streams: work can be queued on side streams and ordered with events (copy engines).
        name: the GPU's model as the driver names it (``"NVIDIA H200"``); ``""`` when
            interpreted. Tuning tables are keyed by it.
        nvlink: whether the GPU has an active NVLink (to a peer GPU or an NVSwitch), as NVML
            reports it; None when that is not known (no NVML, or interpreted).
        ranks_on_device: how many ranks of the job use this rank's GPU, itself included (1
            when interpreted). More than one means the ranks share the GPU: the GPU
            time-slices their kernels, which is a mode for correctness, not speed (see
            :attr:`shared`). Exact once this process has made a heap on the device or asked
            :func:`iris.mem.node_layout` (the ranks compare their GPUs then); before,
            counted from the launcher's ``LOCAL_WORLD_SIZE`` ranks on the visible GPUs.
    """

    device: torch.device
    backend: str
    interpreted: bool
    sm_count: int
    compute_capability: tuple[int, int] | None
    resident_programs: int
    pdl: bool
    tma: bool
    streams: bool
    name: str = ""
    nvlink: bool | None = None
    ranks_on_device: int = 1

    @property
    def shared(self) -> bool:
        """Whether other ranks use this rank's GPU too (:attr:`ranks_on_device` > 1): their
        kernels and this rank's take turns on the GPU, so times measure the sharing (tuning
        tables are not read, tuners and benchmarks refuse to run)."""
        return self.ranks_on_device > 1


#: Programs the interpreter runs per launch of a persistent kernel: few, since each is slow.
INTERPRETED_PROGRAMS = 2


def capabilities(device: torch.device | str | None = None) -> Capabilities:
    """The :class:`Capabilities` of ``device`` (None: :func:`default_device`) in this process."""
    return _capabilities(torch.device(device) if device is not None else default_device())


@functools.cache
def _capabilities(device: torch.device) -> Capabilities:
    if device.type != "cuda" or settings.interpreted():
        backend = "cuda" if device.type == "cuda" else "cpu"
        return Capabilities(device, backend, True, 0, None, INTERPRETED_PROGRAMS, False, False, False)
    index = device.index if device.index is not None else torch.cuda.current_device()
    props = torch.cuda.get_device_properties(index)
    cc = (props.major, props.minor)
    hopper = cc >= (9, 0)
    sms = props.multi_processor_count
    # Ranks sharing the GPU do not change what one launch may do: without MPS the GPU runs
    # one process's kernels at a time (time slices), each with every SM, so one program per
    # SM stays resident for the launch as on a GPU of its own (docs/cuda-backend.md).
    caps = Capabilities(torch.device("cuda", index), "cuda", False, sms, cc, sms, hopper, hopper, True)
    sharing = _RANKS_ON_DEVICE.get(index) or launcher_ranks_on_gpu(
        settings.local_rank(), settings.local_world_size(), torch.cuda.device_count(), index
    )
    return dataclasses.replace(caps, name=props.name, nvlink=_nvlink(props), ranks_on_device=sharing)


# ------------------------------------------------------------------ ranks and their GPUs


def gpu_index(rank_on_node: int, gpus: int) -> int:
    """The GPU a rank uses with the cuda backend: its index on the node (``LOCAL_RANK``)
    modulo the ``gpus`` visible, so ranks beyond the GPU count share GPUs round robin."""
    if gpus < 1:
        raise ValueError(f"gpus must be at least 1, got {gpus}")
    return rank_on_node % gpus


def rank_gpu(global_rank: int | None = None) -> int:
    """The GPU of this process with the cuda backend (:func:`gpu_index` of ``LOCAL_RANK``,
    else of ``global_rank``, else of the launcher's ``RANK``); needs a visible GPU."""
    local = settings.local_rank()
    if local is None:
        local = global_rank if global_rank is not None else int(settings.launcher_rank()[0])
    return gpu_index(local, torch.cuda.device_count())


def launcher_ranks_on_gpu(local_rank: int | None, local_world_size: int | None, gpus: int, index: int) -> int:
    """How many of the ``local_world_size`` ranks a launcher started on this node map to GPU
    ``index`` (:func:`gpu_index`), at least 1; 1 when the launcher did not say (either value
    None) or ``local_rank`` maps to another GPU (the caller's device is not its rank's)."""
    if local_rank is None or local_world_size is None or gpus < 1 or gpu_index(local_rank, gpus) != index:
        return 1
    return max(1, len(range(index, local_world_size, gpus)))


def launcher_shares_gpus(local_world_size: int | None, gpus: int) -> bool:
    """Whether a launcher that started ``local_world_size`` ranks on a node with ``gpus``
    visible GPUs makes some of them share a GPU (more ranks than GPUs)."""
    return local_world_size is not None and gpus >= 1 and local_world_size > gpus


def ranks_sharing(gpus_of_ranks: list, rank: int) -> int:
    """How many ranks use the GPU of ``rank``, itself included, given every rank's GPU
    identity (``gpus_of_ranks[r]``; None for a rank without one, which shares with none)."""
    mine = gpus_of_ranks[rank]
    return 1 if mine is None else sum(1 for g in gpus_of_ranks if g == mine)


class SharedGpuWarning(UserWarning):
    """Ranks share a GPU: a mode for correctness, not speed (issued once per process)."""


#: Ranks using each GPU of this process (by device index), as the ranks' comparisons found.
_RANKS_ON_DEVICE: dict[int, int] = {}
_sharing_lock = threading.Lock()
_warned_shared = False


def note_ranks_on_device(index: int, count: int) -> None:
    """Record that ``count`` ranks use GPU ``index`` (the most any comparison of the ranks'
    GPUs found: a heap's bring-up, :func:`iris.mem.node_layout`). The first time more than
    one do, warn once (:func:`warn_shared`)."""
    with _sharing_lock:
        if count <= _RANKS_ON_DEVICE.get(index, 0):
            return
        _RANKS_ON_DEVICE[index] = count
        _capabilities.cache_clear()
    if count > 1:
        warn_shared(count, index)


def warn_shared(count: int, index: int) -> bool:
    """Warn (:class:`SharedGpuWarning`, once per process) that ``count`` ranks share GPU
    ``index``; returns whether this call warned."""
    global _warned_shared
    with _sharing_lock:
        if _warned_shared:
            return False
        _warned_shared = True
    warnings.warn(
        f"iris.mem: {count} ranks share GPU cuda:{index}. The GPU runs their kernels in turns (time "
        "slices): this is a mode for correctness, not speed. Times measure the sharing, so tuning "
        "tables are not read (auto picks by heuristic) and the tuners and benchmarks refuse to run.",
        SharedGpuWarning,
        stacklevel=3,
    )
    return True


#: Links NVML numbers per GPU (``NVML_NVLINK_MAX_LINKS``).
_NVML_MAX_LINKS = 18


def _nvlink(props) -> bool | None:
    """Whether the GPU of ``props`` has an active NVLink, asked of NVML (the driver's
    library, through ctypes); None when NVML or the GPU's UUID is not available."""
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
        if nvml.nvmlInit_v2() != 0:
            return None
        handle = ctypes.c_void_p()
        uuid = f"GPU-{props.uuid}".encode()
        if nvml.nvmlDeviceGetHandleByUUID(ctypes.c_char_p(uuid), ctypes.byref(handle)) != 0:
            return None
        active = ctypes.c_int()
        for link in range(_NVML_MAX_LINKS):
            status = nvml.nvmlDeviceGetNvLinkState(handle, ctypes.c_uint(link), ctypes.byref(active))
            if status in (2, 3):  # invalid argument / not supported: no such link
                return False
            if status != 0:
                return None
            if active.value:
                return True
        return False
    except (OSError, AttributeError):
        return None


def default_device() -> torch.device:
    """The device of heaps made with the default backend (``IRIS_BACKEND``, else a GPU when
    one is visible): this rank's GPU (:func:`rank_gpu`: ``LOCAL_RANK`` modulo the GPUs
    present; without a launcher the current GPU), or the CPU."""
    if settings.default_backend() == "cuda":
        if settings.local_rank() is None and settings.text("RANK") is None:
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cuda", rank_gpu())
    return torch.device("cpu")


def synchronize(device: torch.device | str) -> None:
    """Wait until every kernel queued on ``device`` by this process has finished (a no-op
    when kernels are interpreted: they finish before their launch returns)."""
    caps = capabilities(device)
    if caps.streams:
        torch.cuda.synchronize(caps.device)


def capturing(device: torch.device | str) -> bool:
    """Whether the current stream of ``device`` is being captured into a CUDA graph."""
    caps = capabilities(device)
    return caps.streams and torch.cuda.is_current_stream_capturing()


_KEEPER: list[concurrent.futures.ThreadPoolExecutor] = []
_KEEPER_LOCK = threading.Lock()
_KEEPER_STREAMS: dict[torch.device, torch.cuda.Stream] = {}


def _keeper() -> concurrent.futures.ThreadPoolExecutor:
    with _KEEPER_LOCK:
        if not _KEEPER:
            _KEEPER.append(concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="iris-keeper"))
        return _KEEPER[0]


def _make_kept(values: list[int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    with torch.cuda.device(device):
        stream = _KEEPER_STREAMS.get(device)
        if stream is None:
            stream = _KEEPER_STREAMS[device] = torch.cuda.Stream(device)
        host = torch.tensor(values, dtype=dtype).pin_memory()
        with torch.cuda.stream(stream):
            made = torch.empty(len(values), dtype=dtype, device=device)
            made.copy_(host, non_blocking=True)
        stream.synchronize()  # this copy alone: the stream is the keeper's own
    return made


def kept_tensor(values: Sequence[int], dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """A 1-d ``dtype`` tensor of ``values`` on ``device``, ready when returned, for a table
    that outlives the call (kept by a heap or a cache).

    It is made outside any memory pool that the calling thread's allocations are routed to:
    ``torch.compile(mode="reduce-overhead")`` runs its first calls with the thread's
    allocations routed to its CUDA graph pool and refuses a pool holding tensors it does not
    track, so a table made there by the first call of an op would fail the compiled function.
    On devices with streams another thread makes it (allocations of other threads are not
    routed), on a stream of its own; the caller waits for that copy alone. Not while the
    current stream is being captured (a capture owns what it allocates)."""
    caps = capabilities(device)
    if not caps.streams:
        return torch.tensor(list(values), dtype=dtype, device=caps.device)
    if torch.cuda.is_current_stream_capturing():
        raise RuntimeError("kept_tensor: the current stream is being captured into a CUDA graph")
    return _keeper().submit(_make_kept, list(values), dtype, caps.device).result()


__all__ = [
    "INTERPRETED_PROGRAMS",
    "Capabilities",
    "SharedGpuWarning",
    "capabilities",
    "capturing",
    "kept_tensor",
    "default_device",
    "gpu_index",
    "launcher_ranks_on_gpu",
    "launcher_shares_gpus",
    "note_ranks_on_device",
    "rank_gpu",
    "ranks_sharing",
    "synchronize",
    "warn_shared",
]
