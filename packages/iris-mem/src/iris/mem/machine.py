"""What the layers above iris.mem may know about the machine their kernels run on.

iris.ccl and iris.ops never ask which backend or device type they run on: they ask
:func:`capabilities` (or ``heap.capabilities``) what the machine can do, and
:func:`synchronize` / :func:`capturing` to wait for or inspect queued work.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools

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


#: Programs the interpreter runs per launch of a persistent kernel: few, since each is slow.
INTERPRETED_PROGRAMS = 2


@functools.cache
def capabilities(device: torch.device | str) -> Capabilities:
    """The :class:`Capabilities` of ``device`` in this process."""
    device = torch.device(device)
    if device.type != "cuda" or settings.interpreted():
        backend = "cuda" if device.type == "cuda" else "cpu"
        return Capabilities(device, backend, True, 0, None, INTERPRETED_PROGRAMS, False, False, False)
    index = device.index if device.index is not None else torch.cuda.current_device()
    props = torch.cuda.get_device_properties(index)
    cc = (props.major, props.minor)
    hopper = cc >= (9, 0)
    sms = props.multi_processor_count
    caps = Capabilities(torch.device("cuda", index), "cuda", False, sms, cc, sms, hopper, hopper, True)
    return dataclasses.replace(caps, name=props.name, nvlink=_nvlink(props))


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
    one is visible): the current GPU, or the CPU."""
    if settings.default_backend() == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
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


__all__ = [
    "INTERPRETED_PROGRAMS",
    "Capabilities",
    "capabilities",
    "capturing",
    "default_device",
    "synchronize",
]
