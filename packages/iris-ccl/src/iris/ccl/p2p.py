"""``send`` / ``recv``: point to point between two ranks of a group, matched in call order
per (sender, receiver) pair, as in ``torch.distributed`` with NCCL.

Where. Messages travel through a small symmetric heap of the group's, holding the mailboxes
(:func:`iris.ccl._comm.p2p`). Every rank of the group makes it together: when a
torch.distributed group of the ``iris`` backend is made (so a send/recv can be such a group's
first call, between any two of its ranks), else with the group's first collective on
iris.ccl's own heap, else at the first send/recv of the group (on every rank).

Protocol. Every rank of that heap holds one mailbox slot per sender
(``IRIS_CCL_P2P_BYTES``, default 256 KiB) split into tiles of ``_comm.P2P_TILE_BYTES``, and
int32 counters ``[4, group size, tiles]``:

* ``seq[s, t]`` on the receiver: messages sender ``s`` has put in tile ``t`` (written by ``s``);
* ``ack[r, t]`` on the sender: messages receiver ``r`` has taken from tile ``t`` (written by ``r``);
* ``sent[r, t]`` / ``received[s, t]``: the local counts of each side.

Program ``t`` of ``send`` waits (acquire) until the receiver has acknowledged the previous
message in its tile, stores the tile into the receiver's mailbox and publishes the next
sequence number (release, system scope). Program ``t`` of ``recv`` waits for that number,
copies the tile out and acknowledges it. A message larger than the slot is sent as several
launches of one slot each. Counters only grow and live on the device, so nothing is reset
between calls or CUDA graph replays; every wait is bounded (``IRIS_WAIT_TIMEOUT``) and
records a timeout naming the rank and its peer.

A send returns once its last slot-full is in the receiver's mailbox: a message of up to one
slot does not wait for the matching ``recv`` (only for the previous message to that peer
to have been received). Both sides must move the same number of bytes.

Batches. :func:`exchange` runs several sends and receives of this rank (a
``batch_isend_irecv``, or the queued isends and irecvs of an ``iris`` group) in rounds: round
``k`` sends the ``k``-th slot-full of every peer's messages, then receives the ``k``-th
slot-full from every peer. A send of round ``k`` waits only for receives of earlier rounds,
which every peer has made before, so rings, pairs and all-to-all patterns of any size
complete.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist
import triton
import triton.language as tl

from iris.mem.triton import Context
from iris.mem.utils import wait_at_least

from . import _comm, _host, _rooted, entry
from .config import Config, select
from .settings import p2p_bytes
from .triton import record_timeout
from .work import Work

_SEQ, _ACK, _SENT, _RECEIVED = 0, 1, 2, 3


@triton.jit
def _wait_for(flag, target, budget, status, rank, peer):
    """Spin (acquire, system scope) until the local int32 ``*flag >= target``, for at most
    ``budget`` ns; record a timeout naming ``rank`` and ``peer`` and return False if it
    never does (later waits over ``status`` then give up too: see ``keep_waiting``)."""
    ok = wait_at_least(flag, target, budget, status, peer) >= target
    if not ok:
        record_timeout(status, rank, peer, flag)
    return ok


@triton.jit
def send_tile(ctx, src, box, seq, ack, sent, offs, mask, peer, tile, status, budget):
    """Send tile ``tile`` of a message: ``src[offs]`` (local, any memory) goes to ``box[offs]``
    in heap rank ``peer``'s mailbox.

    :param box: this sender's mailbox slot (the same offset on every rank's heap).
    :param seq: the receiver's ``seq`` row of this sender (int32 per tile, on the heap).
    :param ack: this rank's ``ack`` row of the receiver (int32 per tile, on the heap).
    :param sent: this rank's ``sent`` row of the receiver (int32 per tile).
    """
    previous = tl.load(sent + tile)
    # The receiver has taken the previous message out of this tile.
    if _wait_for(ack + tile, previous, budget, status, ctx.rank, peer):
        x = tl.load(src + offs, mask=mask)
        # The mailbox is 16-byte aligned on every heap: keep the remote stores vectorised.
        ctx.store(box + offs, x, peer, mask=mask, hint=16)
        tl.debug_barrier()  # every thread's remote stores come before the release below
        ctx.atomic_max(seq + tile, previous + 1, peer, sem="release", scope="sys")
        tl.store(sent + tile, previous + 1)


@triton.jit
def recv_tile(ctx, dst, box, seq, ack, received, offs, mask, peer, tile, status, budget):
    """Receive tile ``tile`` of a message from heap rank ``peer``: wait for it in ``box``
    (this rank's mailbox slot of ``peer``), copy it to ``dst[offs]`` (local, any memory),
    and acknowledge it.

    :param seq: this rank's ``seq`` row of the sender (int32 per tile, on the heap).
    :param ack: the sender's ``ack`` row of this receiver (int32 per tile, on the heap).
    :param received: this rank's ``received`` row of the sender (int32 per tile).
    """
    expected = tl.load(received + tile) + 1
    if _wait_for(seq + tile, expected, budget, status, ctx.rank, peer):
        tl.debug_barrier()  # every thread reads after the acquire above
        x = tl.load(box + offs, mask=mask)
        tl.store(dst + offs, x, mask=mask)
        tl.debug_barrier()  # every thread's reads happen before the release below
        ctx.atomic_max(ack + tile, expected, peer, sem="release", scope="sys")
        tl.store(received + tile, expected)


@triton.jit
def _transfer_kernel(
    context, members, flags, epochs, status, budget, data, box, seq, ack, count, nbytes, peer,
    RANK: tl.constexpr, WORLD: tl.constexpr, GROUP: tl.constexpr, ME: tl.constexpr, BLOCK: tl.constexpr,
    SEND: tl.constexpr,
):  # fmt: skip
    """Send (``SEND``) ``nbytes`` elements (bytes, or int32 words) of ``data`` to heap rank
    ``peer``, or receive them from it into ``data``, in tiles of ``BLOCK`` elements
    (``P2P_TILE_BYTES`` bytes), each program looping over its share; ``count`` is the
    per-tile counter of messages sent to (or received from) ``peer``."""
    ctx = Context.initialize(context, RANK, WORLD)
    t = tl.program_id(0)  # persistent: tiles pid, pid + P, ...
    while t < tl.cdiv(nbytes, BLOCK):
        offs = t * BLOCK + tl.arange(0, BLOCK)
        if SEND:
            send_tile(ctx, data, box, seq, ack, count, offs, offs < nbytes, peer, t, status, budget)
        else:
            recv_tile(ctx, data, box, seq, ack, count, offs, offs < nbytes, peer, t, status, budget)
        t += tl.num_programs(0)


def _check_peer(kind: str, tensor: torch.Tensor, rank: object, group) -> None:
    """Checks of send (``kind == "send"``, ``rank`` the receiver) and recv."""
    name = "dst" if kind == "send" else "src"
    if rank is None:
        raise ValueError(
            f"{kind}: {name}=None (any peer) is not supported (NCCL refuses it too); pass the peer's "
            "global rank"
        )
    _rooted.member_index(rank, group, name, kind)
    _host.check_tensor(tensor, "tensor")
    if dist.get_rank() == rank:
        raise ValueError(f"{kind}: {name}={rank} is this rank; a rank cannot {kind} to itself")


@dataclasses.dataclass(frozen=True)
class Transfer:
    """One send (``kind == "send"``) or receive of a batch: ``tensor`` to or from global
    rank ``peer``."""

    kind: str
    tensor: torch.Tensor
    peer: int


class _Message:
    """The launches that move one message through a pair's mailbox, one per slot-full."""

    def __init__(self, transfer: Transfer, peer: int, comm: _comm.Communicator, config: Config | None):
        kind, tensor = transfer.kind, transfer.tensor
        self.tensor = tensor
        self.kind = kind
        self.data = _rooted.flat(tensor)
        self.launches: list[Callable[[], None]] = []
        nbytes = tensor.numel() * tensor.element_size()
        if nbytes == 0:
            return
        raw = self.data.view(torch.uint8)
        # Whole 16-byte words move as int32 vectors; any other message byte by byte. The
        # mailbox holds the same bytes either way, so the two sides need not agree on it.
        word = 4 if nbytes % 16 == 0 and raw.data_ptr() % 16 == 0 else 1
        cfg = dataclasses.replace(
            select(kind, nbytes, comm.size, comm.capabilities.interpreted, config),
            block_size=_comm.P2P_TILE_BYTES // word,
        )
        slot_bytes = p2p_bytes(_comm.P2P_TILE_BYTES)
        counters = comm.p2p_counters.view(4, comm.size, slot_bytes // _comm.P2P_TILE_BYTES)
        sender, receiver = (comm.index, peer) if kind == "send" else (peer, comm.index)
        box = comm.p2p_mailbox[sender * slot_bytes : (sender + 1) * slot_bytes]
        seq, ack = counters[_SEQ, sender], counters[_ACK, receiver]
        count = counters[_SENT, peer] if kind == "send" else counters[_RECEIVED, peer]
        if word == 4:
            raw, box = raw.view(torch.int32), box.view(torch.int32)
        for start, length in _host.chunks(nbytes // word, slot_bytes // word):
            grid = _host.persistent_grid(comm, cfg, length)
            args = (raw[start:], box, seq, ack, count, length, comm.members[peer])
            self.launches.append(
                functools.partial(_host.launch, _transfer_kernel, grid, comm, cfg, *args, SEND=kind == "send")
            )

    def finish(self) -> None:
        if self.kind == "recv":
            _host.copy_back(self.tensor, self.data)


def exchange(
    transfers: Sequence[Transfer], group=None, config: Config | None = None, timeout: float | None = None
) -> None:
    """Run this rank's ``transfers`` (checked) over ``group`` in rounds (module docstring):
    any pattern of sends and receives completes, whatever the sizes.

    :param timeout: device-side waits give up after at most this many seconds (None: the
        group's budget).
    """
    if not transfers:
        return
    comm = _comm.p2p(group, transfers[0].tensor.device)
    peers = sorted({t.peer for t in transfers})
    index = {p: _rooted.member_index(p, group, "peer", "send/recv") for p in peers}
    messages = [_Message(t, index[t.peer], comm, config) for t in transfers]
    sends: dict[int, list] = {p: [] for p in peers}
    recvs: dict[int, list] = {p: [] for p in peers}
    for t, m in zip(transfers, messages):
        (sends if t.kind == "send" else recvs)[t.peer].extend(m.launches)
    rounds = max(len(queue) for queue in (*sends.values(), *recvs.values()))
    with comm.wait_limit(timeout):
        for k in range(rounds):
            for queues in (sends, recvs):
                for p in peers:
                    if k < len(queues[p]):
                        queues[p][k]()
    for m in messages:
        m.finish()


def _check_send(tensor: torch.Tensor, dst: int, *, group, **_) -> None:
    _check_peer("send", tensor, dst, group)


def _check_recv(tensor: torch.Tensor, src: int, *, group, **_) -> None:
    _check_peer("recv", tensor, src, group)


@entry.op("send", tensors=("tensor",), outputs=("tensor",), device="tensor", validate=_check_send)
def send(
    tensor: torch.Tensor, dst: int, *, group=None, async_op: bool = False, config: Config | None = None
) -> Work | None:
    """Send ``tensor`` to global rank ``dst`` of ``group`` (matched with ``dst``'s
    :func:`recv` from this rank, in call order).

    :param tensor: the message: any shape, dtype and layout; the receiver's tensor must hold
        the same number of bytes.
    :param dst: global rank of the receiver (as in ``torch.distributed``), a member of
        ``group`` other than this rank.
    :param group: torch.distributed group, or None for the world.
    :param async_op: return a :class:`Work` handle instead of None.
    :param config: a :class:`Config`; only ``num_warps`` applies (tiles are fixed).

    Runs on the group's send/recv heap (module docstring: on a group that is not of the
    ``iris`` backend, every rank of the group makes it together at its first collective on
    iris.ccl's own heap or its first send/recv). A message longer than the mailbox
    (``IRIS_CCL_P2P_BYTES``) returns once its last part is in the receiver's mailbox, so
    two ranks that both send long messages to each other must use one batch
    (``torch.distributed.batch_isend_irecv`` on an ``iris`` group) rather than two sends.
    """
    exchange([Transfer("send", tensor, dst)], group, config)
    return Work(tensor.device) if async_op else None


@entry.op("recv", tensors=("tensor",), outputs=("tensor",), device="tensor", validate=_check_recv)
def recv(
    tensor: torch.Tensor, src: int, *, group=None, async_op: bool = False, config: Config | None = None
) -> Work | None:
    """Receive into ``tensor`` the next message global rank ``src`` of ``group`` sends to
    this rank. Parameters as for :func:`send`; ``src`` may not be None (no wildcard)."""
    exchange([Transfer("recv", tensor, src)], group, config)
    return Work(tensor.device) if async_op else None
