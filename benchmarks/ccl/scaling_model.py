"""A cost model of iris.ccl's staged collectives over several nodes, beside flat NCCL.

    python benchmarks/ccl/scaling_model.py            # the tables of docs/scaling.md
    python benchmarks/ccl/scaling_model.py --nodes 4 --sizes 256KiB,16MiB

Nothing is measured here: every time is an alpha-beta estimate (a latency per step plus
bytes over a rate) from the constants below. Within a node the rates and latencies are
Iris's and NCCL's measured on 2 x H200 (docs/performance.md); between nodes they are
published figures for one 400 Gb/s NDR InfiniBand NIC per GPU and the latency constants
of NCCL's own tuning model. The staged forms follow iris.ccl._staged step by step (stages
run one after another, as the code does; its local copies and staging copies included).
The output is deterministic: docs/scaling.md holds it verbatim, and
tests/docs/test_scaling_model.py checks that it still does.
"""

from __future__ import annotations

import argparse
import math

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30

# ---------------------------------------------------------------- the machine modelled
#: GPUs of one node (an HGX H200 board: every GPU on NVLink through NVSwitch).
GPUS_PER_NODE = 8
#: Node counts and sizes of the printed tables: bytes of each rank's larger buffer (the input;
#: all_gather's output, so that a row is a size one GPU can hold at every node count).
NODE_COUNTS = (2, 8, 64)
SIZES = (64 * KiB, MiB, 64 * MiB, GiB)
#: bf16, as the measured tables.
ELEMENT_BYTES = 2
#: Elements per piece of the staged all_reduce (iris.ccl._staged.PIECE_ELEMENTS).
PIECE_ELEMENTS = 1 << 22

# ---------------------------------------------------------------- within a node: Iris
# docs/performance.md, 2 x H200, bf16, the `auto` column (what Config() runs, and what the
# staged path calls): latency = the 8 KiB row, rate = bus bytes / time of the 1 GiB row.
IRIS_8KIB_US = {"all_reduce": 3.6, "all_gather": 2.9, "reduce_scatter": 3.2, "all_to_all": 3.2}
IRIS_1GIB_US = {"all_reduce": 2853.5, "all_gather": 2822.0, "reduce_scatter": 1708.7, "all_to_all": 1468.4}
#: broadcast is not timed there: every peer pulls from the root, so the root's link carries
#: (G - 1) copies at the remote-load rate (remote access table, `load`, 1 GiB row), after a
#: start like all_gather's.
IRIS_LOAD_GBPS = 374.3
#: A local op (copy, fill) launched from a CUDA graph (performance.md, Limits: about 1 us).
LAUNCH_US = 1.0
#: Assumed, not measured: bytes per second a device-local copy moves on an H200 (HBM3e is
#: 4.8 TB/s peak; a copy reads and writes each byte).
COPY_GBPS = 2000.0

# ---------------------------------------------------------------- within a node: NCCL
# The same table's `nccl` column, 1 GiB rows: NCCL's NVLink rate per collective (bus bytes /
# time); broadcast is not timed and takes all_gather's.
NCCL_1GIB_US = {"all_reduce": 3293.6, "all_gather": 3872.9, "reduce_scatter": 2105.4, "all_to_all": 1686.3}

# ---------------------------------------------------------------- between nodes
#: One 400 Gb/s NDR InfiniBand NIC per GPU is 50 GB/s on the wire; 46 GB/s is the rate
#: assumed achievable per NIC (published NCCL results put it at 45-48 GB/s).
NIC_GBPS = 46.0
#: NCCL's tuning-model latencies (us): base per call, per NVLink hop, per network hop, and
#: the model's bandwidth factor of the protocol (LL carries a flag in every word).
NCCL_LAT = {
    ("ring", "LL"): (6.6, 0.6, 2.7, 1 / 4),
    ("ring", "Simple"): (8.4, 3.4, 14.0, 1.0),
    ("tree", "LL"): (6.8, 0.6, 5.0, 1 / 3.8),
    ("tree", "Simple"): (0.0, 4.0, 14.0, 0.9),
}
#: The same model stretches an NVLink hop of LL by this factor in a job over several nodes.
NCCL_LL_MULTINODE_NVLINK = 1.8

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast")


def _bus_bytes(coll: str, nbytes: float, ranks: int) -> float:
    """NCCL's bus bytes of ``coll`` over ``ranks`` ranks, ``nbytes`` of input per rank."""
    if ranks == 1:
        return 0.0
    if coll == "all_reduce":
        return 2 * (ranks - 1) / ranks * nbytes
    if coll == "all_gather":
        return (ranks - 1) * nbytes  # (G-1)/G of the G * nbytes output
    if coll in ("reduce_scatter", "all_to_all"):
        return (ranks - 1) / ranks * nbytes
    if coll == "broadcast":
        return nbytes
    raise ValueError(coll)


def _rate(table: dict, coll: str) -> float:
    """Bytes per us of the measured 2-rank 1 GiB row (bus bytes over time)."""
    return _bus_bytes(coll, GiB, 2) / table[coll]


def iris_intra(coll: str, nbytes: float, k: int) -> float:
    """Time (us) of an Iris collective over ``k`` ranks of one node, ``nbytes`` input each."""
    if k == 1:
        return 0.0
    if coll == "broadcast":
        return IRIS_8KIB_US["all_gather"] + (k - 1) * nbytes / (IRIS_LOAD_GBPS * 1e3)
    return IRIS_8KIB_US[coll] + _bus_bytes(coll, nbytes, k) / _rate(IRIS_1GIB_US, coll)


def _nvlink_rate(coll: str) -> float:
    return _rate(NCCL_1GIB_US, "all_gather" if coll == "broadcast" else coll)


def nccl_flat(coll: str, nbytes: float, k: int, nodes: int) -> tuple[float, str, float]:
    """``(time us, algorithm/protocol, bytes per NIC)`` of NCCL over ``nodes`` nodes of ``k``
    GPUs each (one NIC per GPU, rail-aligned), ``nbytes`` input per rank; the fastest of the
    algorithms and protocols NCCL's model offers for it."""
    n = k * nodes
    if n == 1:
        return 0.0, "-", 0.0
    best = None
    for (algo, proto), (base, nvl_hop, net_hop, factor) in NCCL_LAT.items():
        if algo == "tree" and (coll != "all_reduce" or nodes == 1):
            continue
        if nodes > 1 and proto == "LL":
            nvl_hop *= NCCL_LL_MULTINODE_NVLINK
        if coll == "all_to_all":  # point to point with every peer, in one round
            lat = base + (net_hop if nodes > 1 else nvl_hop)
            nic = nbytes * (n - k) / n
            nvl = nbytes * (k - 1) / n
        elif algo == "tree":  # a chain in the node, a double binary tree across nodes
            lat = base + 2 * ((k - 1) * nvl_hop + math.ceil(math.log2(nodes)) * net_hop)
            nic = 2 * nbytes / k
            nvl = 2 * nbytes * (k - 1) / k
        else:  # k rings, each leaving every node through one NIC
            steps = {"all_reduce": 2 * (n - 1), "broadcast": n - 1}.get(coll, n - 1)
            inter = {"all_reduce": 2 * (nodes - 1)}.get(coll, nodes - 1)
            lat = base + (steps - inter) * nvl_hop + inter * net_hop
            bus = _bus_bytes(coll, nbytes, n)
            nic = bus / k if nodes > 1 else 0.0
            nvl = bus * (1 - 1 / k) if nodes > 1 else bus
        seconds = max(nic / (NIC_GBPS * 1e3), nvl / _nvlink_rate(coll) if nvl else 0.0)
        t = lat + seconds / factor
        if best is None or t < best[0]:
            best = (t, f"{algo}/{proto}", nic)
    assert best is not None
    return best


def _copy(nbytes: float, ops: int = 1) -> float:
    return ops * LAUNCH_US + nbytes / (COPY_GBPS * 1e3)


def staged(coll: str, nbytes: float, k: int, nodes: int) -> dict:
    """The staged form of iris.ccl._staged on ``nodes`` nodes of ``k`` ranks (a uniform
    layout): ``{"intra", "inter", "copies", "total"}`` in us and ``"nic"`` bytes per NIC.
    Buffers the code makes with torch are not on a heap, so each Iris stage also copies
    through its staging buffers (one copy in, one out)."""
    n = k * nodes
    intra = inter = copies = nic = 0.0
    if coll == "all_reduce":
        piece_bytes = PIECE_ELEMENTS * ELEMENT_BYTES
        start = 0.0
        while start < nbytes:
            p = min(piece_bytes, nbytes - start)
            start += p
            shard = math.ceil(p / ELEMENT_BYTES / k) * ELEMENT_BYTES
            intra += iris_intra("reduce_scatter", k * shard, k) + iris_intra("all_gather", shard, k)
            t, _, b = nccl_flat("all_reduce", shard, 1, nodes)
            inter += t
            nic += b
            # zeroed and filled buffer, staging in/out of both stages, the piece's result
            copies += _copy(k * shard / 2) + _copy(p) + _copy(k * shard + shard, 2)
            copies += _copy(shard + k * shard, 2) + _copy(p)
        copies += _copy(nbytes)  # into out
    elif coll == "all_gather":
        t, _, nic = nccl_flat("all_gather", nbytes, 1, nodes)
        inter = t
        intra = iris_intra("all_gather", nodes * nbytes, k)
        copies = _copy(nodes * nbytes + n * nbytes, 2) + _copy(2 * n * nbytes, 2)  # staging; reorder, out
    elif coll == "reduce_scatter":
        intra = iris_intra("reduce_scatter", nbytes, k)
        t, _, nic = nccl_flat("reduce_scatter", nbytes / k, 1, nodes)
        inter = t
        copies = _copy(nbytes) + _copy(nbytes + nbytes / k, 2) + _copy(nbytes / n)  # reorder; staging; out
    elif coll == "all_to_all":
        intra = iris_intra("all_to_all", nbytes, k)
        t, _, nic = nccl_flat("all_to_all", nbytes, 1, nodes)
        inter = t
        # reorder; staging in and out; regroup, place, out
        copies = _copy(nbytes) + _copy(2 * nbytes, 2) + _copy(3 * nbytes, 3)
    elif coll == "broadcast":  # through the root's local index: one NIC per node
        t, _, nic = nccl_flat("broadcast", nbytes, 1, nodes)
        inter = t
        intra = iris_intra("broadcast", nbytes, k)
        copies = _copy(nbytes)  # staging (the relay's copy in, or each peer's copy out)
    else:
        raise ValueError(coll)
    return {"intra": intra, "inter": inter, "copies": copies, "total": intra + inter + copies, "nic": nic}


def _size(nbytes: float) -> str:
    for unit, name in ((GiB, "GiB"), (MiB, "MiB"), (KiB, "KiB")):
        if nbytes >= unit and nbytes % unit == 0:
            return f"{int(nbytes // unit)} {name}"
    return f"{int(nbytes)} B"


def _us(t: float) -> str:
    return f"{t:.1f}" if t < 100 else f"{t:.0f}"


def table(coll: str, sizes, node_counts, k: int = GPUS_PER_NODE) -> list[str]:
    lines = [
        f"**{coll}** ({k} GPUs per node; size: {'the output' if coll == 'all_gather' else 'the input'} "
        "per rank; us)",
        "",
        "| size | nodes | flat NCCL | NCCL algorithm | staged | Iris in nodes | between nodes | local copies "
        "| NCCL / staged | NIC bytes staged / flat |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for size in sizes:
        for nodes in node_counts:
            inp = size / (k * nodes) if coll == "all_gather" else size  # size: the output there
            flat, algo, flat_nic = nccl_flat(coll, inp, k, nodes)
            s = staged(coll, inp, k, nodes)
            nic_ratio = s["nic"] / flat_nic if flat_nic else float("nan")
            lines.append(
                f"| {_size(size)} | {nodes} | {_us(flat)} | {algo} | {_us(s['total'])} | {_us(s['intra'])} "
                f"| {_us(s['inter'])} | {_us(s['copies'])} | {flat / s['total']:.2f} | {nic_ratio:.2f} |"
            )
    return lines


#: Measured 2-rank times (us) the calibration compares with: the `auto` and `nccl` columns
#: of docs/performance.md at 1 MiB and 32 MiB (between the rows the model was fitted to).
MEASURED_2 = {
    ("all_reduce", MiB): (7.8, 17.3),
    ("all_reduce", 32 * MiB): (110.6, 141.5),
    ("all_gather", MiB): (9.5, 20.4),
    ("all_gather", 32 * MiB): (107.9, 164.3),
    ("reduce_scatter", MiB): (7.4, 13.1),
    ("reduce_scatter", 32 * MiB): (65.4, 97.7),
    ("all_to_all", MiB): (5.9, 16.3),
    ("all_to_all", 32 * MiB): (56.5, 85.2),
}


def calibration() -> list[str]:
    """The model on one node of 2 GPUs beside what was measured there."""
    lines = [
        "**The model on 2 x H200 beside the measurement** (one node; size: the input per rank; us)",
        "",
        "| collective | size | Iris measured | Iris model | NCCL measured | NCCL model |",
        "|---|---|---|---|---|---|",
    ]
    for (coll, size), (iris_us, nccl_us) in MEASURED_2.items():
        model_nccl = nccl_flat(coll, size, 2, 1)[0]
        lines.append(
            f"| {coll} | {_size(size)} | {_us(iris_us)} | {_us(iris_intra(coll, size, 2))} "
            f"| {_us(nccl_us)} | {_us(model_nccl)} |"
        )
    return lines


def report(sizes=SIZES, node_counts=NODE_COUNTS) -> str:
    parts = []
    for coll in COLLECTIVES:
        parts.append("\n".join(table(coll, sizes, node_counts)))
    parts.append("\n".join(calibration()))
    return "\n\n".join(parts) + "\n"


def _parse_size(text: str) -> int:
    text = text.strip()
    for name, unit in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if text.endswith(name):
            return int(float(text[: -len(name)]) * unit)
    return int(text)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", help="node counts, comma separated (default 2,8,64)")
    parser.add_argument("--sizes", help="per-rank sizes, e.g. 64KiB,1MiB (default 64KiB,1MiB,64MiB,1GiB)")
    args = parser.parse_args(argv)
    nodes = tuple(int(x) for x in args.nodes.split(",")) if args.nodes else NODE_COUNTS
    sizes = tuple(_parse_size(x) for x in args.sizes.split(",")) if args.sizes else SIZES
    if any(x < 2 for x in nodes) or any(x < ELEMENT_BYTES for x in sizes):
        parser.error(
            "node counts must be at least 2 (one node runs no stages) and sizes at least one element"
        )
    print(report(sizes, nodes), end="")


if __name__ == "__main__":
    main()
