"""``python -m iris.mem.tracing render TRACE [TRACE ...] [OUT.png]``: see :func:`iris.mem.tracing.main`."""

import sys

from . import main

sys.exit(main())
