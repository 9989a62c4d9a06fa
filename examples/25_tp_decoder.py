"""A tensor-parallel Llama-style decoder layer, communicating three ways, eager and compiled.

The layer: RMSNorm, attention (q/k/v projections as one column-parallel linear, RoPE, torch's
scaled-dot-product attention with grouped-query heads, a row-parallel output projection),
residual add, RMSNorm, a gated SiLU MLP (gate and up as one column-parallel linear, a
row-parallel down projection), residual add. Each rank holds its slice of the heads and of
the MLP's hidden units. The same layer code runs with the communication done by:

* ``nccl`` (or ``gloo``): torch.distributed collectives on the default group, named after
  what moves its GPU tensors (NCCL on GPUs; gloo on the CPU backend and where ranks share a
  GPU, which NCCL refuses): ``all_reduce`` after each row-parallel linear;
* ``iris``: the same torch.distributed calls on a group made with ``backend="iris"``, so
  they run on :mod:`iris.ccl`;
* ``fused``: :func:`iris.ops.matmul_all_reduce` for each row-parallel linear (GEMM and
  all-reduce in one kernel);
* ``fused_sp``: the sequence-parallel layout (each rank holds a slice of the tokens between
  the linears): :func:`iris.ops.all_gather_matmul` for the column-parallel linears and
  :func:`iris.ops.matmul_reduce_scatter` for the row-parallel ones.

Each form runs eagerly and under ``torch.compile(fullgraph=True)`` (``aot_eager`` on the CPU
backend; inductor with ``mode="reduce-overhead"``, i.e. CUDA graphs, on GPUs, but for the
``gloo`` form, whose copies through host memory a graph cannot hold), for a prefill
(one causal sequence) and a decode step (one new token per sequence against a KV cache), and
every output is checked against the unsharded layer computed in float64 on one device.
``benchmarks/ops/bench_decoder.py`` times the same layer at Llama-3 shapes.

The world size must divide the number of KV heads and of tokens (the shapes here work for 1,
2, 3 and 6 ranks on the CPU backend, 1, 2, 3, 4, 6 and 8 on GPUs; the layer raises
``ValueError`` otherwise).

Run: ``torchrun --nproc_per_node=3 examples/25_tp_decoder.py`` (no GPU needed; on one GPU the
three ranks share it).
"""

from __future__ import annotations

import dataclasses
import sys

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.nn.functional as F
from torch import Tensor

import iris.ccl  # noqa: F401 - imports iris.mem first; registers the "iris" torch.distributed backend
import iris.ops

NAME = "tp_decoder"


@dataclasses.dataclass(frozen=True)
class LayerShape:
    """The sizes of one decoder layer."""

    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    eps: float = 1e-5
    rope_theta: float = 500000.0


LLAMA3_8B = LayerShape(hidden=4096, heads=32, kv_heads=8, head_dim=128, ffn=14336)
LLAMA3_70B = LayerShape(hidden=8192, heads=64, kv_heads=8, head_dim=128, ffn=28672)
#: Small enough for Triton's interpreter; no size a multiple of a tile; 1, 2, 3, 6 ranks.
TINY = LayerShape(hidden=40, heads=12, kv_heads=6, head_dim=8, ffn=66)
#: The example's shape on GPUs: 1, 2, 3, 4, 6 or 8 ranks (on as many GPUs, or fewer, shared).
SMALL = LayerShape(hidden=1536, heads=48, kv_heads=24, head_dim=32, ffn=4224)


# --------------------------------------------------------------------------- weights


def make_weights(shape: LayerShape, dtype: torch.dtype, device, seed: int = 0) -> dict[str, torch.Tensor]:
    """The full (unsharded) weights, the same on every rank: linears as ``(in, out)``
    matrices (``y = x @ w``), scaled so activations stay of order one."""
    g = torch.Generator().manual_seed(seed)
    h, d, f = shape.hidden, shape.head_dim, shape.ffn

    def lin(n_in: int, n_out: int) -> torch.Tensor:
        return (torch.randn(n_in, n_out, generator=g) / n_in**0.5).to(device, dtype)

    def norm() -> torch.Tensor:
        return (1 + 0.1 * torch.randn(h, generator=g)).to(device, dtype)

    return {
        "attn_norm": norm(),
        "wq": lin(h, shape.heads * d),
        "wk": lin(h, shape.kv_heads * d),
        "wv": lin(h, shape.kv_heads * d),
        "wo": lin(shape.heads * d, h),
        "mlp_norm": norm(),
        "wg": lin(h, f),
        "wu": lin(h, f),
        "wd": lin(f, h),
    }


def check_world(shape: LayerShape, world: int) -> None:
    """ValueError unless ``world`` ranks can split the layer's heads and MLP."""
    for what, n in (("heads", shape.heads), ("kv_heads", shape.kv_heads), ("ffn", shape.ffn)):
        if n % world:
            raise ValueError(f"tensor parallelism over {world} ranks needs {what} ({n}) divisible by {world}")


def shard_weights(w: dict[str, Tensor], shape: LayerShape, rank: int, world: int) -> dict[str, Tensor]:
    """This rank's slices: q/k/v (its heads) and gate/up (its MLP units) as one
    column-parallel matrix each; the matching rows of the output and down projections."""
    check_world(shape, world)
    d = shape.head_dim
    q, kv, f = shape.heads // world * d, shape.kv_heads // world * d, shape.ffn // world

    def cols(t: torch.Tensor, n: int) -> torch.Tensor:
        return t[:, rank * n : (rank + 1) * n]

    return {
        "attn_norm": w["attn_norm"],
        "w_qkv": torch.cat([cols(w["wq"], q), cols(w["wk"], kv), cols(w["wv"], kv)], 1).contiguous(),
        "wo": w["wo"][rank * q : (rank + 1) * q].contiguous(),
        "mlp_norm": w["mlp_norm"],
        "w_gu": torch.cat([cols(w["wg"], f), cols(w["wu"], f)], 1).contiguous(),
        "wd": w["wd"][rank * f : (rank + 1) * f].contiguous(),
    }


# --------------------------------------------------------------------------- the layer's pieces


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight


def rope_tables(positions: Tensor, shape: LayerShape, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """cos and sin ``(tokens, head_dim)`` of rotary embeddings at ``positions``."""
    d = shape.head_dim
    inv = shape.rope_theta ** -(torch.arange(0, d, 2, dtype=torch.float64, device=positions.device) / d)
    angles = positions.double()[:, None] * inv[None, :]
    angles = torch.cat([angles, angles], -1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` ``(tokens, heads, head_dim)`` by the tables of its tokens."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


def decode_attention(q, k, v, k_cache, v_cache) -> torch.Tensor:
    """One new token per sequence (``q`` ``(seqs, heads, d)``, ``k``/``v`` ``(seqs, kv_heads,
    d)``) attending to its cache (``(seqs, kv_heads, context, d)``) and to itself. The cache
    is read in place (no concatenated copy); query head ``i`` uses KV head
    ``i // (heads / kv_heads)``, as ``enable_gqa`` does."""
    seqs, heads, d = q.shape
    kv_heads, context = k.shape[1], k_cache.shape[2]
    qg = q.reshape(seqs, kv_heads, heads // kv_heads, d) * d**-0.5
    scores = torch.cat([qg @ k_cache.transpose(-1, -2), (qg * k[:, :, None]).sum(-1, keepdim=True)], -1)
    p = torch.softmax(scores.float(), -1).to(q.dtype)
    out = p[..., :context] @ v_cache + p[..., context:] * v[:, :, None]
    return out.reshape(seqs, heads, d)


# --------------------------------------------------------------------------- communication


#: torch 2.13 renamed the single-tensor all-gather and reduce-scatter (the old names warn).
_all_gather = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)
_reduce_scatter = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)


def _compiling() -> bool:
    return torch.compiler.is_compiling()


class TorchComm:
    """Column- and row-parallel linears communicating through torch.distributed on ``group``:
    the default group (NCCL or gloo) or a group made with ``backend="iris"`` (iris.ccl).
    Eagerly it calls ``dist.all_reduce`` and friends in place; compiled, the functional
    collectives (which torch.compile captures)."""

    def __init__(self, group, sequence_parallel: bool = False):
        self.group = group
        self.name = group.group_name
        self.world = dist.get_world_size(group)
        self.sp = sequence_parallel

    def column(self, h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        if self.sp:  # gather the ranks' tokens first
            if _compiling():
                h = funcol.all_gather_tensor(h, 0, self.name)
            else:
                full = h.new_empty(h.shape[0] * self.world, h.shape[1])
                _all_gather(full, h, group=self.group)
                h = full
        return h @ w

    def row(self, a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        y = a @ w
        if self.sp:  # sum over the ranks, keep this rank's tokens
            if _compiling():
                return funcol.reduce_scatter_tensor(y, "sum", 0, self.name)
            out = y.new_empty(y.shape[0] // self.world, y.shape[1])
            _reduce_scatter(out, y, group=self.group)
            return out
        if _compiling():
            return funcol.all_reduce(y, "sum", self.name)
        dist.all_reduce(y, group=self.group)
        return y


class FusedComm:
    """The linears as iris.ops' fused kernels over ``group`` (None: the world). Eagerly the
    public functions; compiled, the functional ``torch.ops.iris`` ops (which return their
    result rather than copy it into an output)."""

    def __init__(self, group=None, sequence_parallel: bool = False):
        self.group = group
        self.name = "" if group is None else group.group_name
        self.world = dist.get_world_size(group)
        self.sp = sequence_parallel

    def column(self, h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        if not self.sp:
            return h @ w
        if _compiling():
            return torch.ops.iris.all_gather_matmul(h, w, None, 0, self.name, "")
        out = h.new_empty(h.shape[0] * self.world, w.shape[1])
        iris.ops.all_gather_matmul(out, h, w, group=self.group)
        return out

    def row(self, a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        if self.sp:
            if _compiling():
                return torch.ops.iris.matmul_reduce_scatter(a, w, None, 0, self.name, "")
            out = a.new_empty(a.shape[0] // self.world, w.shape[1])
            iris.ops.matmul_reduce_scatter(out, a, w, group=self.group)
            return out
        if _compiling():
            return torch.ops.iris.matmul_all_reduce(a, w, None, self.name, "")
        out = a.new_empty(a.shape[0], w.shape[1])
        iris.ops.matmul_all_reduce(out, a, w, group=self.group)
        return out


class NoComm:
    """The same computation with every collective left out (wrong results): the layer's
    time without communication, for benchmarks."""

    def __init__(self, world: int, sequence_parallel: bool = False):
        self.world, self.sp = world, sequence_parallel

    def column(self, h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return (h.repeat(self.world, 1) if self.sp else h) @ w

    def row(self, a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        y = a @ w
        return y[: y.shape[0] // self.world] if self.sp else y


# --------------------------------------------------------------------------- the layer


class TPDecoderLayer(torch.nn.Module):
    """One rank's part of a tensor-parallel decoder layer; ``comm`` does the communication.

    ``forward(x)`` takes the residual stream ``(tokens, hidden)``, all tokens (or, with a
    sequence-parallel ``comm``, this rank's ``tokens / world`` of them, in rank order) and
    returns the layer's output in the same layout. Without a cache the tokens are one causal
    sequence; after :meth:`set_cache` each token is the next one of its own sequence. The
    weights (and cache, RoPE tables) are parameters and buffers, which CUDA graphs keep in
    place rather than copy at each replay.
    """

    def __init__(self, shard: dict[str, torch.Tensor], shape: LayerShape, world: int, comm):
        super().__init__()
        check_world(shape, world)
        for name, t in shard.items():
            self.register_parameter(name, torch.nn.Parameter(t, requires_grad=False))
        self.shape, self.comm = shape, comm
        self.heads, self.kv_heads = shape.heads // world, shape.kv_heads // world
        for name in ("cos", "sin", "k_cache", "v_cache"):
            self.register_buffer(name, None)

    def set_rope(self, cos: torch.Tensor | None, sin: torch.Tensor | None) -> None:
        """RoPE tables ``(tokens, head_dim)`` of every token of a call (None: no RoPE)."""
        self.cos, self.sin = cos, sin

    def set_cache(self, k_cache: torch.Tensor | None, v_cache: torch.Tensor | None) -> None:
        """This rank's KV heads of the cache, ``(sequences, kv_heads / world, context,
        head_dim)`` each (None: prefill)."""
        self.k_cache, self.v_cache = k_cache, v_cache

    def _attend(self, q, k, v) -> torch.Tensor:
        if self.k_cache is not None:
            return decode_attention(q, k, v, self.k_cache, self.v_cache)
        q, k, v = (t.transpose(0, 1)[None] for t in (q, k, v))  # (1, heads, tokens, d)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)[0].transpose(0, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        d, eps = self.shape.head_dim, self.shape.eps
        qkv = self.comm.column(rms_norm(x, self.attn_norm, eps), self.w_qkv)
        tokens = qkv.shape[0]
        q, k, v = qkv.split([self.heads * d, self.kv_heads * d, self.kv_heads * d], 1)
        q, k, v = q.reshape(tokens, self.heads, d), k.reshape(tokens, -1, d), v.reshape(tokens, -1, d)
        if self.cos is not None:
            q, k = rope(q, self.cos, self.sin), rope(k, self.cos, self.sin)
        x = x + self.comm.row(self._attend(q, k, v).reshape(tokens, -1), self.wo)
        gate, up = self.comm.column(rms_norm(x, self.mlp_norm, eps), self.w_gu).chunk(2, 1)
        return x + self.comm.row(F.silu(gate) * up, self.wd)


def reference_layer(w: dict[str, torch.Tensor], x: torch.Tensor, shape: LayerShape, cos=None, sin=None,
                    k_cache=None, v_cache=None) -> torch.Tensor:  # fmt: skip
    """The unsharded layer on one device, in float64, written plainly (attention by torch's
    SDPA, the decode step over the cache and the new token concatenated)."""
    w = {n: t.double() for n, t in w.items()}
    x, d = x.double(), shape.head_dim
    tokens = x.shape[0]
    h = rms_norm(x, w["attn_norm"], shape.eps)
    q = (h @ w["wq"]).reshape(tokens, shape.heads, d)
    k = (h @ w["wk"]).reshape(tokens, shape.kv_heads, d)
    v = (h @ w["wv"]).reshape(tokens, shape.kv_heads, d)
    if cos is not None:
        q, k = rope(q, cos.double(), sin.double()), rope(k, cos.double(), sin.double())
    if k_cache is None:  # one causal sequence: (1, heads, tokens, d)
        q, k, v, causal = q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None], True
    else:  # one token per sequence: (tokens, heads, 1, d) against cache + itself
        k = torch.cat([k_cache.double(), k[:, :, None]], 2)
        v = torch.cat([v_cache.double(), v[:, :, None]], 2)
        q, causal = q[:, :, None], False
    o = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    o = o[0].transpose(0, 1) if k_cache is None else o[:, :, 0]
    x = x + o.reshape(tokens, -1) @ w["wo"]
    h = rms_norm(x, w["mlp_norm"], shape.eps)
    return x + (F.silu(h @ w["wg"]) * (h @ w["wu"])) @ w["wd"]


# --------------------------------------------------------------------------- the example


def make_forms(world: int) -> dict[str, object]:
    """The communication of each form (collective: makes the iris group on every rank). The
    default group's form is named after what moves its GPU tensors: NCCL, or gloo (the CPU
    backend, and GPUs shared by several ranks, which NCCL refuses)."""
    iris_group = dist.new_group(backend="iris")  # torch.distributed calls on it run on iris.ccl
    default = "nccl" if "nccl" in str(dist.get_backend_config()) else "gloo"
    return {
        default: TorchComm(dist.group.WORLD),
        "iris": TorchComm(iris_group),
        "fused": FusedComm(None),
        "fused_sp": FusedComm(None, sequence_parallel=True),
    }


def main() -> int:
    from _ccl_example import check, report, setup

    rank, world, device = setup()
    gpu = device.type == "cuda"
    shape = SMALL if gpu else TINY
    dtype = torch.bfloat16 if gpu else torch.float32
    tokens, context = (48, 100) if gpu else (6, 5)  # tokens divisible by the world (sequence parallel)
    compile_kw = {"mode": "reduce-overhead"} if gpu else {"backend": "aot_eager"}
    errors: list[str] = []
    try:
        weights = make_weights(shape, dtype, device)  # the same on every rank
        shard = shard_weights(weights, shape, rank, world)
        if tokens % world:
            raise ValueError(f"{tokens} tokens do not split over {world} ranks")
    except ValueError as e:
        return report(NAME, [str(e)])
    g = torch.Generator().manual_seed(1)
    x = torch.randn(tokens, shape.hidden, generator=g).to(device, dtype)
    cache_shape = (tokens, shape.kv_heads, context, shape.head_dim)
    k_cache, v_cache = (torch.randn(cache_shape, generator=g).to(device, dtype) for _ in range(2))
    kv = slice(rank * shape.kv_heads // world, (rank + 1) * shape.kv_heads // world)
    cases = {  # name: (positions, full cache or None)
        "prefill": (torch.arange(tokens, device=device), None),
        "decode": (torch.full((tokens,), context, device=device), (k_cache, v_cache)),
    }
    forms = make_forms(world)
    for case, (positions, cache) in cases.items():
        cos, sin = rope_tables(positions, shape, dtype)
        want = reference_layer(weights, x, shape, cos, sin, *(cache or (None, None)))
        tol = (0.03 if gpu else 1e-3) * want.abs().max().item()
        for form, comm in forms.items():
            layer = TPDecoderLayer(shard, shape, world, comm)
            layer.set_rope(cos, sin)
            if cache is not None:
                layer.set_cache(cache[0][:, kv].contiguous(), cache[1][:, kv].contiguous())
            mine = slice(rank * tokens // world, (rank + 1) * tokens // world) if comm.sp else slice(None)
            check(errors, f"{case} {form} eager", layer(x[mine]), want[mine], atol=tol)
            torch.compiler.reset()  # a fresh compile per layer (each would count as a recompile)
            # gloo moves GPU tensors through host memory, which a CUDA graph cannot capture:
            # its form compiles with inductor alone (no CUDA graphs)
            kw = {} if gpu and form == "gloo" else compile_kw
            compiled = torch.compile(layer, fullgraph=True, dynamic=False, **kw)
            for i in range(3 if gpu else 1):  # on GPUs: warm-up, capture, replay of the CUDA graph
                torch.compiler.cudagraph_mark_step_begin()  # a new call: earlier outputs may be reused
                out = compiled(x[mine]).clone()
                check(errors, f"{case} {form} compiled call {i}", out, want[mine], atol=tol)
    # A rank leaves matmul_reduce_scatter as soon as its own rows have arrived: let every rank
    # finish its last call before any of them releases the workspaces and exits.
    dist.barrier()
    iris.ops.release_workspaces()
    note = f"({', '.join(forms)}; prefill and decode; eager and compiled; {tokens} tokens, {world} ranks)"
    return report(NAME, errors, note)


if __name__ == "__main__":
    sys.exit(main())
