"""The pytest plugin: registers the ``polgrad_conforms`` marker.

Loaded for every pytest session through the ``pytest11`` entry point, so this module and
everything it imports at module level stays free of torch.
"""

from __future__ import annotations

import pytest

MARKER = "polgrad_conforms"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(reference, **options): check the marked loss function against the "
        "named polgrad reference semantics (see pytest-polgrad docs)",
    )
