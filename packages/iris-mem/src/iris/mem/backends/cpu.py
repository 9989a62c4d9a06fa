"""CPU backend: ranks are processes, heaps are POSIX shared memory, kernels are interpreted.

Each rank creates one shared-memory segment of ``heap_size`` bytes with mode 0600 under
an unpredictable name, every peer maps it, and after a barrier that proves all peers have
mapped it the owner unlinks the name. From then on nothing is left in ``/dev/shm`` even if
the job is killed: the memory lives only as long as some process maps it.
"""

from __future__ import annotations

import mmap
import os
import secrets

import numpy as np
import torch

from ..bootstrap import Communicator
from ..settings import interpreted
from . import Backend

try:  # CPython's own binding of shm_open/shm_unlink (what multiprocessing uses).
    import _posixshmem
except ImportError:  # pragma: no cover - non-POSIX platforms
    _posixshmem = None

SEGMENT_PREFIX = "iris-"


def _shm_free_bytes() -> int | None:
    try:
        stat = os.statvfs("/dev/shm")
    except OSError:
        return None
    return stat.f_bavail * stat.f_frsize


def _check_triton_is_interpreted() -> None:
    """Triton's own library functions (``tl.zeros``, ``tl.sum``...) are decorated when
    ``triton.language`` is first imported; if that happened before ``TRITON_INTERPRET`` was
    set, kernels in the interpreter fail inside them with an obscure message."""
    import triton.language.standard as standard
    from triton.runtime.jit import JITFunction

    if isinstance(standard.zeros, JITFunction):
        raise RuntimeError(
            "triton was imported before Triton's interpreter was turned on, so its library "
            "functions are compiled for GPUs and cannot run on the cpu backend. Import iris.mem before "
            "triton, or set TRITON_INTERPRET=1 in the environment before starting Python."
        )


class CpuBackend(Backend):
    """Heaps in POSIX shared memory, kernels in Triton's interpreter."""

    name = "cpu"
    interpreted = True

    def __init__(self) -> None:
        if _posixshmem is None:
            raise RuntimeError(
                "the cpu backend needs POSIX shared memory (shm_open), which this platform lacks"
            )
        if not interpreted():
            raise RuntimeError(
                "the cpu backend runs kernels in Triton's interpreter, but TRITON_INTERPRET is not set. "
                "Set IRIS_BACKEND=cpu (or TRITON_INTERPRET=1) in the environment before importing iris.mem "
                "and before defining any @triton.jit kernel: Triton fixes a kernel's mode when it is defined."
            )
        _check_triton_is_interpreted()
        self._maps: list[mmap.mmap] = []
        self._tensors: list[torch.Tensor] = []
        self._name: str | None = None

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    def map_heaps(self, heap_size: int, comm: Communicator) -> tuple[torch.Tensor, list[int]]:
        free = _shm_free_bytes()
        need = heap_size * comm.world_size
        # Segments are sparse, but a full tmpfs kills the process with SIGBUS once they
        # fill up, so refuse up front what cannot fit.
        if free is not None and need > free:
            raise MemoryError(
                f"heap_size={heap_size} bytes x {comm.world_size} ranks = {need} bytes does not fit in "
                f"/dev/shm ({free} bytes free); pass a smaller heap_size to iris.mem.init()"
            )
        name = f"/{SEGMENT_PREFIX}{secrets.token_hex(16)}"
        fd = _posixshmem.shm_open(name, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode=0o600)
        self._name = name
        try:
            os.ftruncate(fd, heap_size)
            local = mmap.mmap(fd, heap_size)
        finally:
            os.close(fd)
        names = comm.all_gather_object(name)
        maps: list[mmap.mmap] = []
        try:
            for rank, peer_name in enumerate(names):
                if rank == comm.rank:
                    maps.append(local)
                    continue
                peer_fd = _posixshmem.shm_open(peer_name, os.O_RDWR, mode=0o600)
                try:
                    size = os.fstat(peer_fd).st_size
                    if size != heap_size:
                        raise RuntimeError(
                            f"rank {rank}'s heap segment holds {size} bytes, expected heap_size={heap_size}"
                        )
                    maps.append(mmap.mmap(peer_fd, heap_size))
                finally:
                    os.close(peer_fd)
        finally:
            # Every peer has mapped (or failed to map) our segment once all pass this
            # barrier; the name is no longer needed.
            comm.barrier()
            self._unlink()
        self._maps = maps
        # numpy holds a buffer export of each mmap and torch holds the array, so a mapping
        # cannot be unmapped while any tensor still views it (mmap.close() then refuses).
        self._tensors = [torch.from_numpy(np.frombuffer(m, dtype=np.uint8)) for m in maps]
        bases = [t.data_ptr() for t in self._tensors]
        return self._tensors[comm.rank], bases

    def _unlink(self) -> None:
        if self._name is not None:
            try:
                _posixshmem.shm_unlink(self._name)
            except FileNotFoundError:
                pass
            self._name = None

    def heap_bytes(self, rank: int) -> torch.Tensor:
        return self._tensors[rank]

    def synchronize(self) -> None:
        # Interpreted kernels finish before their launch returns.
        return None

    def close(self) -> None:
        self._unlink()
        self._tensors = []
        for m in self._maps:
            try:
                m.close()
            except BufferError:
                # Heap tensors still alive elsewhere keep this mapping; it is released
                # when the last of them is freed (the segment itself is already unlinked).
                pass
        self._maps = []
