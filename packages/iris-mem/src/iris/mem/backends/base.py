"""The interface every backend implements (:class:`Backend`)."""

from __future__ import annotations

import abc

import torch

from ..bootstrap import Communicator


class Backend(abc.ABC):
    """The small interface every backend implements.

    Lifetime: construct, :meth:`map_heaps` once (collective), use, :meth:`close`.
    """

    #: Name as accepted by ``iris.mem.init(backend=...)``.
    name: str = ""
    #: Whether kernels run in Triton's interpreter (and so complete before launch returns).
    interpreted: bool = False

    @property
    @abc.abstractmethod
    def device(self) -> torch.device:
        """Device on which heap tensors live."""

    @abc.abstractmethod
    def map_heaps(self, heap_size: int, comm: Communicator) -> tuple[torch.Tensor, list[int]]:
        """Create this rank's heap and map every peer's (collective).

        :param heap_size: bytes per rank, the same on every rank.
        :returns: this rank's heap as a ``uint8`` tensor of ``heap_size`` bytes, and the
            address, in this process, of each rank's heap (index = group rank).
        """

    @abc.abstractmethod
    def heap_bytes(self, rank: int) -> torch.Tensor:
        """``rank``'s whole heap as a ``uint8`` tensor of this process (its own heap, or
        the mapping of a peer's), on :attr:`device`; valid until :meth:`close`."""

    @abc.abstractmethod
    def synchronize(self) -> None:
        """Wait for all work this process queued on the device."""

    @abc.abstractmethod
    def post(self, word: torch.Tensor, value: int) -> None:
        """Write ``value`` into ``word`` (one int64 element of this rank's heap) now, from any
        thread, without waiting for the work queued or running on the device: a kernel that
        polls the word sees it while it runs."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release peer mappings and this rank's heap. Idempotent."""


__all__ = ["Backend"]
