"""Test support for this project and for connector authors.

``faults`` wraps real stores and sinks to inject failures; ``assertions``
holds the guard checks the conformance kit makes, as plain functions. The
pytest kit itself, :class:`~.conformance.GuardConformance`, lives in
``dpone_native_transfer.testing.conformance`` and is not imported here, so
importing this package (the CLI demo does) never needs pytest.
"""

from __future__ import annotations

from . import assertions, contract, faults
from .assertions import *  # noqa: F403 - each module's __all__ is the public part
from .contract import *  # noqa: F403
from .faults import *  # noqa: F403

__all__ = sorted([*assertions.__all__, *contract.__all__, *faults.__all__])
