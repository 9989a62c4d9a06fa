"""Every old ``iris.device`` path and name, with the canonical ``iris.mem`` one it aliases."""

#: Old module -> the new module it aliases.
OLD_MODULES = {
    "iris.device": "iris.mem",
    "iris.device.triton": "iris.mem.triton",
    "iris.device.triton.context": "iris.mem.triton.context",
    "iris.device.triton.ops": "iris.mem.triton.ops",
    "iris.device.triton.tracing": "iris.mem.triton.tracing",
    "iris.device.gluon": "iris.mem.gluon",
    "iris.device.gluon.context": "iris.mem.gluon.context",
    "iris.device.gluon.tracing": "iris.mem.gluon.tracing",
    "iris.device.utils": "iris.mem.utils",
}

#: (old module, old name, canonical dotted name of the object).
OLD_NAMES = [
    ("iris.device.triton", "DeviceContext", "iris.mem.triton.Context"),
    ("iris.device.triton.context", "DeviceContext", "iris.mem.triton.Context"),
    ("iris.device.triton", "DeviceTracing", "iris.mem.triton.Tracing"),
    ("iris.device.triton.tracing", "DeviceTracing", "iris.mem.triton.Tracing"),
    ("iris.device.gluon", "IrisDeviceCtx", "iris.mem.gluon.Context"),
    ("iris.device.gluon.context", "IrisDeviceCtx", "iris.mem.gluon.Context"),
    ("iris.device.gluon", "GluonDeviceTracing", "iris.mem.gluon.Tracing"),
    ("iris.device.gluon.tracing", "GluonDeviceTracing", "iris.mem.gluon.Tracing"),
]
