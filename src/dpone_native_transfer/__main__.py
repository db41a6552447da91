"""``python -m dpone_native_transfer``: the ``dpone-transfer`` command."""

import sys

from ._entry import main

sys.exit(main())
