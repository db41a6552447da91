"""``python -m dpone_native_transfer``: the ``dpone-transfer`` command."""

import sys

from .cli import main

sys.exit(main())
