"""Interop tests: clients not written here (rhea on Node.js, cli-proton-python) through a real broker."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "interop: third-party AMQP clients (rhea via npm, cli-proton-python)")
