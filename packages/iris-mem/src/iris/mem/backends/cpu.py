"""CPU backend: ranks are processes, heaps are POSIX shared memory, kernels are interpreted.

Each rank creates one shared-memory segment of ``heap_size`` bytes with mode 0600 under
an unpredictable name, every peer maps it, and after a barrier that proves all peers have
mapped it the owner unlinks the name. From then on nothing is left in ``/dev/shm`` even if
the job is killed: the memory lives only as long as some process maps it.

The ranks exchange the names before any segment exists, so a rank that dies before the
unlink (killed while it waits for its peers) leaves a segment whose name the survivors
know: their next step fails, and they unlink every rank's name. Where no rank survives,
the name carries its creator's pid namespace and pid
(``iris-<namespace>-<pid>-<128 random bits in hex>``), and the next heap made on the
machine by the same user removes segments whose creating process has exited
(:func:`remove_orphans`).
"""

from __future__ import annotations

import gc
import mmap
import os
import secrets

import numpy as np
import torch
import triton.language.standard as triton_standard
from triton.runtime.jit import JITFunction

from .._process import exited, pid_namespace
from ..bootstrap import Communicator
from ..settings import interpreted
from ..triton._compat import explain_compiled_launches
from .base import Backend

try:  # CPython's own binding of shm_open/shm_unlink (what multiprocessing uses).
    import _posixshmem
except ImportError:  # pragma: no cover - non-POSIX platforms
    _posixshmem = None

SEGMENT_PREFIX = "iris-"
_SHM = "/dev/shm"


def _shm_free_bytes() -> int | None:
    try:
        stat = os.statvfs(_SHM)
    except OSError:
        return None
    return stat.f_bavail * stat.f_frsize


def segment_name() -> str:
    """A new segment name: the prefix, the pid namespace and pid of this process (so an
    orphan can be told from a live heap) and 128 random bits."""
    namespace = pid_namespace()
    owner = f"{namespace}-{os.getpid()}-" if namespace is not None else ""
    return f"/{SEGMENT_PREFIX}{owner}{secrets.token_hex(16)}"


def remove_orphans() -> list[str]:
    """Unlink the segments of this backend that a process of this pid namespace and user
    created and then exited without unlinking (killed before its peers learnt the name).
    Returns the names removed."""
    namespace = pid_namespace()
    if namespace is None or _posixshmem is None:
        return []
    prefix = f"{SEGMENT_PREFIX}{namespace}-"
    try:
        names = [n for n in os.listdir(_SHM) if n.startswith(prefix)]
    except OSError:
        return []
    removed = []
    for name in names:
        pid = name[len(prefix) :].split("-", 1)[0]
        if not pid.isdigit() or int(pid) == os.getpid() or not exited(int(pid)):
            continue
        try:
            if os.stat(os.path.join(_SHM, name)).st_uid != os.getuid():
                continue
            _posixshmem.shm_unlink("/" + name)
        except OSError:  # gone already, or not ours
            continue
        removed.append(name)
    return removed


def _unlink_all(names: list[str]) -> None:
    """Unlink every name of ``names`` that still exists (after a failed heap creation: the
    peers' too, since a dead peer cannot)."""
    for name in names:
        try:
            _posixshmem.shm_unlink(name)
        except OSError:
            pass


def _check_triton_is_interpreted() -> None:
    """Triton's own library functions (``tl.zeros``, ``tl.sum``...) are decorated when
    ``triton.language`` is first imported; if that happened before ``TRITON_INTERPRET`` was
    set, kernels in the interpreter fail inside them with an obscure message."""
    if isinstance(triton_standard.zeros, JITFunction):
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
        # A kernel the caller defined before importing iris.mem is compiled for a GPU; on a
        # machine without one, its launch says so (not Triton's "0 active drivers").
        explain_compiled_launches()
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
        remove_orphans()  # of earlier jobs killed while they made their heaps
        # Names first, segments after: every segment that exists has a name every rank
        # knows, so a rank that dies at any point leaves nothing the others cannot unlink.
        name = segment_name()
        names = comm.all_gather_object(name)
        local = self._create(name, heap_size, comm, names)
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
            try:
                comm.barrier()
            except BaseException:
                _unlink_all(names)  # a peer died: its segment too
                raise
            finally:
                self._unlink()
        self._maps = maps
        # numpy holds a buffer export of each mmap and torch holds the array, so a mapping
        # cannot be unmapped while any tensor still views it (mmap.close() then refuses).
        self._tensors = [torch.from_numpy(np.frombuffer(m, dtype=np.uint8)) for m in maps]
        bases = [t.data_ptr() for t in self._tensors]
        return self._tensors[comm.rank], bases

    def _create(self, name: str, heap_size: int, comm: Communicator, names: list[str]) -> mmap.mmap:
        """Create and map this rank's segment ``name``, then wait until every rank has made
        its own (a barrier); where that fails (a peer died), unlink every rank's name."""
        fd = _posixshmem.shm_open(name, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode=0o600)
        self._name = name
        try:
            os.ftruncate(fd, heap_size)
            local = mmap.mmap(fd, heap_size)
        except BaseException:
            self._unlink()
            raise
        finally:
            os.close(fd)
        try:
            comm.barrier()
        except BaseException:
            local.close()
            self._unlink()
            _unlink_all(names)
            raise
        return local

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

    def post(self, word: torch.Tensor, value: int) -> None:
        # Shared memory: the interpreted kernel of the main thread reads it at its next poll.
        word.fill_(value)

    def close(self) -> None:
        self._unlink()
        self._tensors = []
        maps, self._maps = self._maps, []
        if not _close_all(maps):
            # Triton's interpreter keeps each launch's arguments in reference cycles, which
            # hold heap tensors (and so the mapping) until the cyclic collector runs.
            gc.collect()
            _close_all(maps)


def _close_all(maps: list[mmap.mmap]) -> bool:
    """Unmap every mapping that nothing else holds; whether all were unmapped. A mapping
    still exported (heap tensors alive elsewhere) is released when the last of them is freed
    (the segment itself is already unlinked)."""
    done = True
    for m in maps:
        try:
            m.close()
        except BufferError:
            done = False
    return done
