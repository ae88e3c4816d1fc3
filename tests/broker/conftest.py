"""Broker tests: assertion rewriting for the shared helpers (their asserts explain failures)."""

import pytest

pytest.register_assert_rewrite("tests.broker.helpers")
