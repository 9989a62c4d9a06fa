"""CUDA backend: one ``cudaMalloc`` heap per GPU, shared with peers through CUDA IPC handles.

Each rank allocates its heap with ``cudaMalloc`` (not from torch's caching allocator, whose
blocks cannot be exported on their own), exports a 64-byte IPC handle, and gathers every
peer's handle over torch.distributed; ``cudaIpcOpenMemHandle`` maps each peer's heap into
this process with peer access enabled. IPC handles are plain bytes, so they travel over
the process group the job already has: no socket mesh and no file-descriptor passing, which
VMM exports would need. The heap has a fixed size, so VMM's ability to grow is not needed.

Ranks may share a GPU (more ranks than GPUs: rank to GPU is the local rank modulo the GPUs
present). A peer on this rank's own GPU is another process there, and its heap is mapped
the same way, by IPC (a handle opens in any process but the one that exported it); only
peer access, which is between two GPUs, is not asked for. Kernels then reach it like any
peer's heap, and the GPU time-slices the ranks' kernels.

The CUDA runtime is reached through ctypes on the ``libcudart`` that torch has already
loaded, so the backend needs no compiled extension and no extra package.
"""

from __future__ import annotations

import ctypes
import os
import socket
import threading

import torch

from .. import machine
from ..bootstrap import Communicator
from ..log import get_logger
from .base import Backend

_log = get_logger(__name__)

_IPC_HANDLE_BYTES = 64
_IPC_LAZY_ENABLE_PEER_ACCESS = 1


class _IpcHandle(ctypes.Structure):
    # Unsigned bytes, not c_char: a c_char array reads back as a NUL-terminated string.
    _fields_ = [("reserved", ctypes.c_ubyte * _IPC_HANDLE_BYTES)]


def _find_cudart() -> ctypes.CDLL:
    """The CUDA runtime library loaded in this process (torch loads it with CUDA)."""
    torch.cuda.init()
    candidates = []
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.rsplit(" ", 1)[-1].strip()
                if "libcudart.so" in os.path.basename(path) and path not in candidates:
                    candidates.append(path)
    except OSError:
        pass
    candidates += ["libcudart.so.13", "libcudart.so.12", "libcudart.so"]
    for name in candidates:
        try:
            lib = ctypes.CDLL(name)
            lib.cudaGetErrorString.restype = ctypes.c_char_p
            return lib
        except OSError:
            continue
    raise RuntimeError(
        "the cuda backend could not find the CUDA runtime (libcudart); install a CUDA build of torch"
    )


class _Runtime:
    """Checked calls into libcudart."""

    def __init__(self) -> None:
        self.lib = _find_cudart()

    def check(self, status: int, what: str) -> None:
        if status != 0:
            message = self.lib.cudaGetErrorString(status).decode()
            raise RuntimeError(f"{what} failed: CUDA error {status} ({message})")

    def malloc(self, nbytes: int) -> int:
        ptr = ctypes.c_void_p()
        self.check(
            self.lib.cudaMalloc(ctypes.byref(ptr), ctypes.c_size_t(nbytes)), f"cudaMalloc({nbytes} bytes)"
        )
        return ptr.value or 0

    def free(self, ptr: int) -> None:
        self.check(self.lib.cudaFree(ctypes.c_void_p(ptr)), "cudaFree")

    def ipc_handle(self, ptr: int) -> bytes:
        handle = _IpcHandle()
        self.check(
            self.lib.cudaIpcGetMemHandle(ctypes.byref(handle), ctypes.c_void_p(ptr)), "cudaIpcGetMemHandle"
        )
        return bytes(bytearray(handle.reserved))

    def ipc_open(self, raw: bytes) -> int:
        if len(raw) != _IPC_HANDLE_BYTES:
            raise ValueError(f"an IPC handle has {_IPC_HANDLE_BYTES} bytes, got {len(raw)}")
        handle = _IpcHandle()
        ctypes.memmove(ctypes.addressof(handle), raw, _IPC_HANDLE_BYTES)
        ptr = ctypes.c_void_p()
        self.lib.cudaIpcOpenMemHandle.argtypes = [ctypes.POINTER(ctypes.c_void_p), _IpcHandle, ctypes.c_uint]
        status = self.lib.cudaIpcOpenMemHandle(ctypes.byref(ptr), handle, _IPC_LAZY_ENABLE_PEER_ACCESS)
        self.check(status, "cudaIpcOpenMemHandle")
        return ptr.value or 0

    def ipc_close(self, ptr: int) -> None:
        self.check(self.lib.cudaIpcCloseMemHandle(ctypes.c_void_p(ptr)), "cudaIpcCloseMemHandle")

    def can_access_peer(self, device: int, peer: int) -> bool:
        flag = ctypes.c_int()
        self.check(
            self.lib.cudaDeviceCanAccessPeer(ctypes.byref(flag), device, peer), "cudaDeviceCanAccessPeer"
        )
        return bool(flag.value)

    def pci_bus_id(self, device: int) -> str:
        buf = ctypes.create_string_buffer(64)
        self.check(self.lib.cudaDeviceGetPCIBusId(buf, 64, device), "cudaDeviceGetPCIBusId")
        return buf.value.decode()

    def device_by_pci_bus_id(self, bus_id: str) -> int | None:
        device = ctypes.c_int()
        status = self.lib.cudaDeviceGetByPCIBusId(ctypes.byref(device), bus_id.encode())
        return device.value if status == 0 else None


class _DeviceMemory:
    """Exposes raw device memory to torch via ``__cuda_array_interface__`` and releases it
    when the last tensor viewing it is gone (torch keeps this object alive)."""

    def __init__(self, runtime: _Runtime, ptr: int, nbytes: int, device: int, owned: bool):
        self.runtime, self.ptr, self.nbytes, self.device, self.owned = runtime, ptr, nbytes, device, owned
        self.__cuda_array_interface__ = {
            "shape": (nbytes,),
            "typestr": "|u1",
            "data": (ptr, False),
            "version": 3,
            "strides": None,
        }

    def release(self) -> None:
        if self.ptr:
            ptr, self.ptr = self.ptr, 0
            try:
                with torch.cuda.device(self.device):
                    torch.cuda.synchronize()
                    self.runtime.free(ptr) if self.owned else self.runtime.ipc_close(ptr)
            except Exception:  # noqa: BLE001 - at interpreter exit CUDA may be gone already
                pass

    def __del__(self) -> None:
        self.release()


class CudaBackend(Backend):
    """Heaps in GPU memory of one node, mapped into every peer with CUDA IPC."""

    name = "cuda"
    interpreted = False

    def __init__(self, comm: Communicator) -> None:
        if not torch.cuda.is_available():
            raise RuntimeError("the cuda backend needs a CUDA GPU, and torch sees none; use backend='cpu'")
        index = machine.rank_gpu(comm.global_rank(comm.rank))  # local rank modulo the GPUs present
        torch.cuda.set_device(index)
        self._device = torch.device("cuda", index)
        self._runtime = _Runtime()
        self._memories: list[_DeviceMemory] = []
        self._by_rank: dict[int, _DeviceMemory] = {}
        self._rank_bytes: dict[int, torch.Tensor] = {}
        self._post_lock = threading.Lock()

    @property
    def device(self) -> torch.device:
        return self._device

    def map_heaps(self, heap_size: int, comm: Communicator) -> tuple[torch.Tensor, list[int]]:
        rt = self._runtime
        index = self._device.index
        me = {"host": socket.gethostname(), "bus_id": rt.pci_bus_id(index)}
        peers = comm.all_gather_object(me)
        hosts = sorted({p["host"] for p in peers})
        if len(hosts) > 1:
            raise RuntimeError(
                f"the cuda backend maps heaps within one node, but the ranks run on hosts {hosts}"
            )
        bus_ids = [p["bus_id"] for p in peers]
        for rank, bus_id in enumerate(bus_ids):
            if bus_id == me["bus_id"]:  # this rank, or a rank sharing its GPU: no peer access to ask
                continue
            peer_index = rt.device_by_pci_bus_id(bus_id)
            if peer_index is not None and not rt.can_access_peer(index, peer_index):
                raise RuntimeError(
                    f"GPU {me['bus_id']} (rank {comm.rank}) cannot access GPU {bus_id} (rank {rank}) as a "
                    "peer: the two are not connected by NVLink or a P2P-capable PCIe path"
                )
        # Ranks sharing this GPU (the same bus id): what capabilities().ranks_on_device says.
        machine.note_ranks_on_device(index, machine.ranks_sharing(bus_ids, comm.rank))
        ptr = rt.malloc(heap_size)
        local = _DeviceMemory(rt, ptr, heap_size, index, owned=True)
        memories = [local]
        try:
            handles = comm.all_gather_object(rt.ipc_handle(ptr))
            bases = []
            for rank, raw in enumerate(handles):
                if rank == comm.rank:
                    bases.append(ptr)
                    continue
                try:
                    peer_ptr = rt.ipc_open(raw)
                except RuntimeError as e:
                    raise RuntimeError(
                        f"rank {comm.rank} could not map rank {rank}'s heap (GPU {bus_ids[rank]}): {e}"
                    ) from e
                memories.append(_DeviceMemory(rt, peer_ptr, heap_size, index, owned=False))
                self._by_rank[rank] = memories[-1]
                bases.append(peer_ptr)
        except BaseException:
            for memory in memories:
                memory.release()
            raise
        self._memories = memories
        heap = torch.as_tensor(local, device=self._device)
        if heap.data_ptr() != ptr:
            raise RuntimeError("torch copied the heap instead of viewing it")
        self._rank_bytes[comm.rank] = heap
        # For post(): made now, not when a kernel spins (pinned allocation may synchronise).
        self._post_source = torch.zeros(1, dtype=torch.int64, pin_memory=True)
        self._post_stream = torch.cuda.Stream(self._device)
        return heap, bases

    def heap_bytes(self, rank: int) -> torch.Tensor:
        if rank not in self._rank_bytes:  # a peer's mapping, viewed on first use
            self._rank_bytes[rank] = torch.as_tensor(self._by_rank[rank], device=self._device)
        return self._rank_bytes[rank]

    def synchronize(self) -> None:
        torch.cuda.synchronize(self._device)

    def post(self, word: torch.Tensor, value: int) -> None:
        # A copy from pinned memory on a stream of its own runs on a copy engine beside the
        # kernels of the other streams, even one spinning on every SM.
        with self._post_lock, torch.cuda.device(self._device):
            self._post_source.fill_(value)
            with torch.cuda.stream(self._post_stream):
                word.copy_(self._post_source, non_blocking=True)
            self._post_stream.synchronize()

    def close(self) -> None:
        # Kernels still queued may use the peer mappings (a send waiting for its receiver):
        # let them finish first. A device already in an error state raises here; the
        # mappings are released all the same.
        try:
            torch.cuda.synchronize(self._device)
        except Exception:  # noqa: BLE001
            _log.warning(
                "close: the device did not synchronise; releasing the mappings anyway", exc_info=True
            )
        # The local heap is freed when the last tensor viewing it is gone; peer mappings are
        # closed now (views from heap_bytes, kept by peer_tensor results, must not outlive it).
        local, peers = (self._memories[0], self._memories[1:]) if self._memories else (None, [])
        for memory in peers:
            memory.release()
        self._memories = []
        self._by_rank.clear()
        self._rank_bytes.clear()
        del local
