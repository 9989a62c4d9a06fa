"""The environment variables iris.ccl reads, each validated when it is read (through
:mod:`iris.mem.settings`): the one module of iris.ccl that reads the environment.

``IRIS_CCL_STAGING_BYTES``
    Bytes of each staging buffer of iris.ccl's own heaps (default 64 MiB where kernels are
    compiled, 4 MiB in the interpreter; at least 16 KiB).
``IRIS_CCL_P2P_BYTES``
    Bytes of each send/recv mailbox slot (default 256 KiB, rounded up to whole tiles).
``IRIS_CCL_PDL``
    ``0`` turns programmatic dependent launch off for the kernels that use it (default on
    where the GPU has it).
``IRIS_CCL_TABLE``
    Path of a tuning table to use instead of the packaged one.
"""

from __future__ import annotations

from iris.mem import Capabilities, settings

#: The smallest staging buffer: two tiles of 1024 8-byte elements, so every launch moves data.
MIN_STAGING_BYTES = 16 << 10
TABLE_ENV = "IRIS_CCL_TABLE"


def staging_bytes(caps: Capabilities) -> int:
    """Bytes of each staging buffer (``IRIS_CCL_STAGING_BYTES``)."""
    default = (4 << 20) if caps.interpreted else (64 << 20)
    return settings.positive_number("IRIS_CCL_STAGING_BYTES", default, int, "bytes", MIN_STAGING_BYTES)


def p2p_bytes(tile_bytes: int) -> int:
    """Bytes of each mailbox slot of send/recv (``IRIS_CCL_P2P_BYTES``, default 256 KiB),
    rounded up to whole tiles of ``tile_bytes``; one slot per sender on every rank."""
    nbytes = settings.positive_number("IRIS_CCL_P2P_BYTES", 256 << 10, int, "bytes")
    return -(-nbytes // tile_bytes) * tile_bytes


def pdl_enabled() -> bool:
    """Whether kernels may use programmatic dependent launch (``IRIS_CCL_PDL``, default on)."""
    return settings.flag("IRIS_CCL_PDL", True)


def table_path() -> str | None:
    """The tuning table named by ``IRIS_CCL_TABLE``, or None for the packaged one."""
    return settings.text(TABLE_ENV)
