"""Kernels written against the old ``iris.device`` layout, left exactly as such code reads.

The Triton kernel uses the old class name ``DeviceContext`` (its ``initialize``, methods
and ``heap_bases`` field) and the reference's module-level translation helper
``__translate``; it is defined at module level, since inside a class body Python would
mangle ``__translate`` to ``_ClassName__translate``. The Gluon kernel uses ``IrisDeviceCtx``;
Gluon needs the ``cuda`` backend, so on the ``cpu`` backend it is only compiled.
"""

import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from iris.device.gluon import IrisDeviceCtx
from iris.device.triton import DeviceContext
from iris.device.triton.context import __translate


@triton.jit
def legacy_exchange_kernel(
    context, src, dst, got, arrivals, n, RANK: tl.constexpr, WORLD: tl.constexpr, BLOCK: tl.constexpr
):
    """Each program pushes its block of ``src`` into the right neighbour's ``dst``
    (``DeviceContext.store``), reads the left neighbour's ``src`` through a translated
    pointer (``__translate``) into ``got``, and counts itself on the right neighbour's
    ``arrivals`` (``DeviceContext.atomic_add``)."""
    ctx = DeviceContext.initialize(context, RANK, WORLD)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    right = (RANK + 1) % WORLD
    left = (RANK + WORLD - 1) % WORLD
    ctx.store(dst + offs, tl.load(src + offs, mask=mask), right, mask=mask)
    remote = __translate(src + offs, RANK, left, ctx.heap_bases)
    tl.store(got + offs, tl.load(remote, mask=mask), mask=mask)
    ctx.atomic_add(arrivals, 1, right, sem="release", scope="sys")


@gluon.jit
def legacy_gluon_exchange_kernel(context, src, dst, arrivals, n, BLOCK: gl.constexpr):
    """The Triton kernel's store and atomic through ``IrisDeviceCtx``, which reads the rank
    and the world size from the context tensor at run time."""
    ctx = IrisDeviceCtx.initialize(context)
    layout: gl.constexpr = gl.BlockedLayout([BLOCK // (32 * gl.num_warps())], [32], [gl.num_warps()], [0])
    offs = gl.program_id(0) * BLOCK + gl.arange(0, BLOCK, layout=layout)
    mask = offs < n
    right = (ctx.rank + 1) % ctx.world_size
    ctx.store(dst + offs, gl.load(src + offs, mask=mask), right, mask=mask)
    ctx.atomic_add(arrivals, 1, right, sem="release", scope="sys")
