from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.procs import BrokerFactory, BrokerProcess


@pytest.fixture
def brokers(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[BrokerFactory]:
    """Start real broker processes: `brokers("--auto-create-queues")`. All are killed at the end; on failure the
    tail of each broker's log is printed."""
    f = BrokerFactory(tmp_path)
    yield f
    failed = getattr(request.node, "rep_call", None)
    if failed is not None and failed.failed:
        for b in f.brokers:
            if b.log_file.exists():
                print(f"--- log of {b.name} (tail) ---")
                print("\n".join(b.log_file.read_text().splitlines()[-40:]))
            if b.stderr_file.exists() and b.stderr_file.stat().st_size:
                print(f"--- stderr of {b.name} ---")
                print(b.stderr_file.read_text()[-3000:])
    for _ in f.cleanup():
        pass


@pytest.fixture
def broker(brokers: BrokerFactory) -> BrokerProcess:
    """One standalone broker with auto-create off (the default)."""
    return brokers()


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    rep = yield
    setattr(item, f"rep_{rep.when}", rep)
    return rep


@pytest.fixture(scope="module")
def shared_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """One broker per test module (auto-create on) for tests that use their own queue names."""
    f = BrokerFactory(tmp_path_factory.mktemp("shared"))
    b = f("--auto-create-queues", name="shared")
    yield b
    for _ in f.cleanup():
        pass


@pytest.fixture
def qname(request: pytest.FixtureRequest) -> str:
    """A queue name unique to the test."""
    return "q-" + request.node.name.replace("[", "-").replace("]", "").replace("/", "-")[:80]
