"""Rules for every test tree (tests/, bench/tests/): how a run ends when it is killed, and what a skip means in CI."""

from __future__ import annotations

import os
from collections.abc import Generator

import pytest

from tests.support.releases import NOT_IN_CLONE
from tests.support.signals import interrupt_on_sigterm

# Skips CI accepts: the history a mixed-release test unpacks is absent from a shallow clone (tests/support/releases.py).
CI_MAY_SKIP = (NOT_IN_CLONE,)


def pytest_configure(config: pytest.Config) -> None:
    """SIGTERM (a CI job's timeout, `kill`) stops the run as Ctrl-C does, so the fixtures still stop every broker,
    ZooKeeper, namespace and iptables rule they started (tests/support/signals.py)."""
    interrupt_on_sigterm()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, pytest.TestReport,
                                                                                          pytest.TestReport]:
    """Under CI (`CI` set) a skipped test fails: the test command installs everything the tests need (Debian and
    PyPI packages, the OCF agent, the C load generator), so a skip there means a set-up that lost a part, and a
    suite that passes by skipping it tests less than it says."""
    rep = yield
    if os.environ.get("CI", "").lower() not in ("", "0", "false") and rep.skipped and not hasattr(rep, "wasxfail"):
        reason = (rep.longrepr[2] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)).removeprefix("Skipped: ")
        if not any(ok in reason for ok in CI_MAY_SKIP):
            rep.outcome = "failed"
            rep.longrepr = f"skipped under CI (CI is set), which the suite does not allow: {reason}"
    return rep
