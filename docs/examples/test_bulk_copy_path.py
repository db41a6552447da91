"""The bulk-copy path passes the guard conformance kit: all a connector author writes.

Run it with ``pytest docs/examples`` from the project root.
"""

from __future__ import annotations

import pytest
from bulk_copy_path import bulk_copy_path

from dpone_native_transfer.testing.conformance import GuardConformance


class TestBulkCopyPath(GuardConformance):
    path_name = "bulk-copy"

    @pytest.fixture
    def transfer_path(self):
        return bulk_copy_path
