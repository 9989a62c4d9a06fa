"""The Triton GEMM core every fused op is built on.

A fused op's kernel is persistent: ``P`` programs (about one per SM) walk a list of output
tiles. For each tile it calls :func:`matmul_tile`, which accumulates ``A[rows, :] @ B[:, cols]``
over the K dimension in fp32 (``tl.dot``: tensor cores for bf16/fp16 and float8, tf32 for
fp32 inputs; ``wgmma`` on Hopper, with e4m3/e5m2 operands for float8), software-pipelined
``num_stages`` deep. Float8 operands carry scales (``value = fp8 x scale``, per tensor or per
row of A / column of B, as ``torch._scaled_mm`` takes them), applied to the fp32 product of a
tile (:func:`scale_rows`, :func:`scale_cols`): exact products of float8 values summed in
fp32, then two multiplications. Tiles are visited in
grouped order (:func:`grouped_tile`: ``GROUP_M`` rows of tiles at a time, so the programs
running together share A rows and B columns in L2).

Edges: rows and columns past the valid extent are clamped to row/column 0 when loading
(every load stays in bounds, no mask in the inner loop) and masked when storing; a K that
is not a multiple of ``BLOCK_K`` masks the K dimension (``EVEN_K=False``).

Under Triton's interpreter two things differ, selected by the constexpr ``INTERPRETED`` a
kernel passes down from its launch (:func:`iris.ops._host.launch` sets it from
``iris.mem.capabilities(device).interpreted`` at each call): loops with run-time bounds are
``while`` loops (``range`` over a run-time value fails there), and ``tl.dot`` multiplies fp32
upcasts (the interpreter's bf16 dot is wrong). Compiled code never sees those branches.
"""

import triton
import triton.language as tl


@triton.jit
def grouped_tile(tile, tiles_m, tiles_n, GROUP_M: tl.constexpr):
    """``(pid_m, pid_n)`` of tile number ``tile`` in a ``tiles_m x tiles_n`` grid walked in
    grouped order: ``GROUP_M`` rows of tiles, column by column, then the next rows."""
    width = GROUP_M * tiles_n
    first_m = (tile // width) * GROUP_M
    size_m = tl.minimum(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (tile % width) % size_m
    pid_n = (tile % width) // size_m
    return pid_m, pid_n


@triton.jit
def _k_block(
    acc, a_ptrs, b_ptrs, a_desc, a_row, b_desc, b_row, b_col, k, k_len, stride_ak, stride_bk,
    BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, TMA_A: tl.constexpr, TMA_B: tl.constexpr,
    INTERPRETED: tl.constexpr,
):  # fmt: skip
    """``acc`` plus the product of K block ``k`` (``a_ptrs``/``b_ptrs`` point at block 0)."""
    in_k = k * BLOCK_K + tl.arange(0, BLOCK_K) < k_len
    if TMA_A:  # the copy engine zero-fills past the tensor's edges
        a = a_desc.load([a_row, k * BLOCK_K])
    elif EVEN_K:
        a = tl.load(a_ptrs + k * BLOCK_K * stride_ak)
    else:
        a = tl.load(a_ptrs + k * BLOCK_K * stride_ak, mask=in_k[None, :], other=0.0)
    if TMA_B:
        b = b_desc.load([b_row + k * BLOCK_K, b_col])
    elif EVEN_K:
        b = tl.load(b_ptrs + k * BLOCK_K * stride_bk)
    else:
        b = tl.load(b_ptrs + k * BLOCK_K * stride_bk, mask=in_k[:, None], other=0.0)
    if INTERPRETED:  # the interpreter's bf16/fp16 dot is wrong: multiply fp32 upcasts
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    else:
        return tl.dot(a, b, acc)  # fp32 inputs: tf32 tensor cores


@triton.jit
def _slice(src, src_ld, dst, ld, k, rows_valid, cols_valid, R: tl.constexpr, BLOCK_M: tl.constexpr,
           BLOCK_N: tl.constexpr, ALIGNED: tl.constexpr):  # fmt: skip
    """Pointers and mask of rows ``[k*R, k*R + R)`` of a ``BLOCK_M x BLOCK_N`` tile at
    ``src`` (row stride ``src_ld``) and of its destination ``dst`` (row stride ``ld``)."""
    r = k * R + tl.arange(0, R)
    c = tl.arange(0, BLOCK_N)
    mask = (r < BLOCK_M)[:, None] & (r < rows_valid)[:, None] & (c < cols_valid)[None, :]
    s_ptrs = src + r.to(tl.int64)[:, None] * src_ld + c[None, :]
    d_ptrs = dst + r.to(tl.int64)[:, None] * ld + c[None, :]
    if ALIGNED:  # the destination (often a peer's, translated) loses its alignment otherwise
        d_ptrs = tl.max_contiguous(tl.multiple_of(d_ptrs, [1, 16]), [1, BLOCK_N])
    return s_ptrs, d_ptrs, mask


@triton.jit
def _k_step(
    acc, part, a_ptrs, b_ptrs, a_desc, a_row, b_desc, b_row, b_col, k, k_len, stride_ak, stride_bk,
    stream_src, stream_src_ld, stream_dst, stream_ld, stream_rows, stream_cols,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
    TMA_A: tl.constexpr, TMA_B: tl.constexpr, STREAM: tl.constexpr, STREAM_ROWS: tl.constexpr,
    STREAM_ALIGNED: tl.constexpr, INTERPRETED: tl.constexpr,
):  # fmt: skip
    """K step ``k`` of :func:`matmul_tile`: the block product, and with ``STREAM`` the next
    slice of the streamed copy. Returns ``(acc, part)``."""
    acc = _k_block(
        acc, a_ptrs, b_ptrs, a_desc, a_row, b_desc, b_row, b_col, k, k_len, stride_ak, stride_bk,
        BLOCK_K, EVEN_K, TMA_A, TMA_B, INTERPRETED,
    )  # fmt: skip
    if STREAM:
        part = _stream_step(
            part, stream_src, stream_src_ld, stream_dst, stream_ld, k, stream_rows, stream_cols,
            STREAM_ROWS, BLOCK_M, BLOCK_N, STREAM_ALIGNED,
        )  # fmt: skip
    return acc, part


@triton.jit
def matmul_tile(
    acc, a, b, row0, m_valid, col0, n_valid, k_len,
    stride_am, stride_ak, stride_bk, stride_bn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
    a_desc=None, a_row=0, b_desc=None, b_row=0, b_col=0,
    TMA_A: tl.constexpr = False, TMA_B: tl.constexpr = False,
    stream_src=None, stream_src_ld=0, stream_dst=None, stream_ld=0, stream_rows=0, stream_cols=0,
    STREAM: tl.constexpr = False, STREAM_ROWS: tl.constexpr = 1, STREAM_ALIGNED: tl.constexpr = False,
    INTERPRETED: tl.constexpr = False,
):  # fmt: skip
    """``acc + a[row0 : row0 + BLOCK_M, :k_len] @ b[:k_len, col0 : col0 + BLOCK_N]`` in fp32.

    :param acc: fp32 ``[BLOCK_M, BLOCK_N]`` accumulator.
    :param a: pointer to A (``stride_am``, ``stride_ak`` elements); rows at or past
        ``m_valid`` are read as row 0 (their results must not be stored).
    :param b: pointer to B (``stride_bk``, ``stride_bn``); columns at or past ``n_valid``
        are read as column 0.
    :param k_len: length of the K dimension; ``EVEN_K`` says it is a multiple of ``BLOCK_K``.
    :param a_desc: with ``TMA_A``, a tensor descriptor of A (blocks ``BLOCK_M x BLOCK_K``)
        read through Hopper's copy engine instead of ``a``: the tile's rows start at row
        ``a_row`` of the descriptor, K at column 0.
    :param b_desc: with ``TMA_B``, a descriptor of B (blocks ``BLOCK_K x BLOCK_N``): the
        tile's K starts at row ``b_row``, its columns at ``b_col``. Rows past ``k_len`` must
        be zero in A when B is read this way (they are: masked or zero-filled).
    :param stream_src: with ``STREAM``, a finished ``BLOCK_M x BLOCK_N`` tile in local
        memory (row stride ``stream_src_ld``), copied to ``stream_dst`` (row stride ``stream_ld``; its
        valid extent ``stream_rows x stream_cols``) ``STREAM_ROWS`` rows per K step while
        this tile is computed, so the copy's bytes leave at the pace of the tensor cores
        (a remote destination's link is then never flooded, and the program never stalls
        on it). Each step loads the next slice and stores the one loaded a step earlier, so
        no load is waited for; rows the K steps do not reach (a K loop shorter than
        ``BLOCK_M / STREAM_ROWS`` steps, e.g. K = 0) are copied after it.
    :param INTERPRETED: the kernel runs in Triton's interpreter (see the module docstring).
    """
    rows = row0 + tl.arange(0, BLOCK_M)
    cols = col0 + tl.arange(0, BLOCK_N)
    # Rows and columns past the edge read row/column 0: every load stays in bounds, so the K
    # loop needs no mask there; the hints keep the loads vectorised despite the clamp.
    rows = tl.max_contiguous(tl.multiple_of(tl.where(rows < m_valid, rows, 0), BLOCK_M), BLOCK_M)
    cols = tl.max_contiguous(tl.multiple_of(tl.where(cols < n_valid, cols, 0), BLOCK_N), BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    a_ptrs = a + rows.to(tl.int64)[:, None] * stride_am + ks[None, :] * stride_ak
    b_ptrs = b + ks[:, None] * stride_bk + cols.to(tl.int64)[None, :] * stride_bn
    k_tiles = tl.cdiv(k_len, BLOCK_K)
    if STREAM:
        s_ptrs, d_ptrs, s_mask = _slice(
            stream_src, stream_src_ld, stream_dst, stream_ld, 0, stream_rows, stream_cols, STREAM_ROWS,
            BLOCK_M, BLOCK_N, STREAM_ALIGNED,
        )  # fmt: skip
        part = tl.load(s_ptrs, mask=s_mask, cache_modifier=".cg")
    else:
        part = 0  # no copy streamed: a placeholder the K steps pass along
    if INTERPRETED:  # range() over a run-time bound fails there
        k = 0
        while k < k_tiles:
            acc, part = _k_step(
                acc, part, a_ptrs, b_ptrs, a_desc, a_row, b_desc, b_row, b_col, k, k_len, stride_ak,
                stride_bk, stream_src, stream_src_ld, stream_dst, stream_ld, stream_rows, stream_cols,
                BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, TMA_A, TMA_B, STREAM, STREAM_ROWS, STREAM_ALIGNED, True,
            )  # fmt: skip
            k += 1
    else:
        for k in range(0, k_tiles):
            acc, part = _k_step(
                acc, part, a_ptrs, b_ptrs, a_desc, a_row, b_desc, b_row, b_col, k, k_len, stride_ak,
                stride_bk, stream_src, stream_src_ld, stream_dst, stream_ld, stream_rows, stream_cols,
                BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, TMA_A, TMA_B, STREAM, STREAM_ROWS, STREAM_ALIGNED, False,
            )  # fmt: skip
    if STREAM:  # rows the K steps did not cover (only when K has fewer steps than planned)
        k = k_tiles
        while k * STREAM_ROWS < BLOCK_M:
            part = _stream_step(
                part, stream_src, stream_src_ld, stream_dst, stream_ld, k, stream_rows, stream_cols,
                STREAM_ROWS, BLOCK_M, BLOCK_N, STREAM_ALIGNED,
            )  # fmt: skip
            k += 1
    return acc


@triton.jit
def _stream_step(part, src, src_ld, dst, ld, k, rows_valid, cols_valid, R: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, ALIGNED: tl.constexpr):  # fmt: skip
    """Store slice ``k`` (``part``, loaded a step earlier) and load slice ``k + 1``."""
    s_next, _, m_next = _slice(
        src, src_ld, dst, ld, k + 1, rows_valid, cols_valid, R, BLOCK_M, BLOCK_N, ALIGNED
    )
    nxt = tl.load(s_next, mask=m_next, cache_modifier=".cg")
    _, d_ptrs, mask = _slice(src, src_ld, dst, ld, k, rows_valid, cols_valid, R, BLOCK_M, BLOCK_N, ALIGNED)
    tl.store(d_ptrs, part, mask=mask)
    return nxt


@triton.jit
def tile_offsets(
    row0, m_valid, col0, n_valid, stride_m, stride_n, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr
):
    """``(origin, offsets, mask)`` of the ``[BLOCK_M, BLOCK_N]`` tile at ``(row0, col0)`` of a
    matrix with strides ``(stride_m, stride_n)`` whose valid extent is ``m_valid x n_valid``:
    element ``(i, j)`` of the tile is at ``origin + offsets[i, j]``. The scalar ``origin`` is
    int64 and the offsets int32 (small, inside the tile), which keeps register use down."""
    rows = tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    origin = tl.cast(row0, tl.int64) * stride_m + tl.cast(col0, tl.int64) * stride_n
    offs = rows[:, None] * stride_m + cols[None, :] * stride_n
    mask = (row0 + rows < m_valid)[:, None] & (col0 + cols < n_valid)[None, :]
    return origin, offs, mask


@triton.jit
def scale_rows(acc, scale, stride, row0, m_valid, SCALED: tl.constexpr, BLOCK_M: tl.constexpr):
    """``acc`` with row ``i`` multiplied by ``scale[(row0 + i) * stride]`` (fp32; ``stride`` 0:
    one scale for every row), when ``SCALED``; rows at or past ``m_valid`` get 0."""
    if SCALED:
        rows = row0 + tl.arange(0, BLOCK_M)
        factor = tl.load(scale + rows.to(tl.int64) * stride, mask=rows < m_valid, other=0.0)
        acc = acc * factor[:, None]
    return acc


@triton.jit
def scale_cols(acc, scale, stride, col0, n_valid, SCALED: tl.constexpr, BLOCK_N: tl.constexpr):
    """``acc`` with column ``j`` multiplied by ``scale[(col0 + j) * stride]`` (fp32; ``stride``
    0: one scale for every column), when ``SCALED``; columns at or past ``n_valid`` get 0."""
    if SCALED:
        cols = col0 + tl.arange(0, BLOCK_N)
        factor = tl.load(scale + cols.to(tl.int64) * stride, mask=cols < n_valid, other=0.0)
        acc = acc * factor[None, :]
    return acc


@triton.jit
def add_bias(acc, bias, col0, n_valid, HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr):
    """``acc + bias[col0 : col0 + BLOCK_N]`` broadcast over rows (fp32), when ``HAS_BIAS``."""
    if HAS_BIAS:
        cols = col0 + tl.arange(0, BLOCK_N)
        acc += tl.load(bias + cols, mask=cols < n_valid, other=0.0).to(tl.float32)[None, :]
    return acc


@triton.jit
def copy_tile(src, src_ld, dst, ld, rows_valid, cols_valid, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              ALIGNED: tl.constexpr):  # fmt: skip
    """Copy the valid ``rows_valid x cols_valid`` part of the ``BLOCK_M x BLOCK_N`` tile at
    ``src`` (row stride ``src_ld``) to ``dst`` (row stride ``ld``) at once: what
    :func:`matmul_tile` streams, when no tile is left to stream it under."""
    s_ptrs, d_ptrs, mask = _slice(
        src, src_ld, dst, ld, 0, rows_valid, cols_valid, BLOCK_M, BLOCK_M, BLOCK_N, ALIGNED
    )
    tl.store(d_ptrs, tl.load(s_ptrs, mask=mask, cache_modifier=".cg"), mask=mask)
