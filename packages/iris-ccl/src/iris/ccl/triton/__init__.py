"""Device-side building blocks of the collectives, for use inside user kernels."""

from .sync import combine, group_sync, record_timeout

__all__ = ["combine", "group_sync", "record_timeout"]
