"""Fixtures: one real ZooKeeper server per test session, and a fresh chroot per test (like kazoo's harness)."""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Iterator

import pytest
from kazoo.client import KazooClient
from kazoo.protocol.states import KazooState

from tests.zk.harness import TcpProxy, ZooKeeperServer, ensure_installed, wait_until


@pytest.fixture(scope="session")
def zk_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZooKeeperServer]:
    ensure_installed()
    server = ZooKeeperServer(tmp_path_factory.mktemp("zookeeper"))
    server.start()
    yield server
    server.stop()


class ZkTest:
    """One test's view of the server: its own chroot, clients it made, and ways to hurt them."""

    def __init__(self, server: ZooKeeperServer) -> None:
        self.server = server
        self.chroot = f"/t-{uuid.uuid4().hex[:12]}"
        self._clients: list[KazooClient] = []
        self._proxies: list[TcpProxy] = []

    @property
    def hosts(self) -> str:
        """Connection string with this test's chroot."""
        return self.server.hosts + self.chroot

    def client(self, session_timeout: float = 2.0, via_proxy: bool = False) -> tuple[KazooClient, TcpProxy | None]:
        """A not-yet-started client in this chroot; through its own `TcpProxy` if asked."""
        proxy = TcpProxy(self.server.port) if via_proxy else None
        if proxy is not None:
            self._proxies.append(proxy)
        address = proxy.address if proxy else self.server.hosts
        client = KazooClient(hosts=address + self.chroot, timeout=session_timeout)
        self._clients.append(client)
        return client, proxy

    def expire_session(self, client: KazooClient, timeout: float = 15.0) -> None:
        """Make the server expire ``client``'s session (by closing it from a second connection), wait for LOST."""
        lost = threading.Event()

        def watch(state: KazooState) -> bool:
            if state == KazooState.LOST:
                lost.set()
                return True
            return False

        client.add_listener(watch)
        session_id, password = client.client_id
        intruder = KazooClient(hosts=self.server.hosts, client_id=(session_id, password), timeout=2.0)
        intruder.start(timeout=10)
        intruder.stop()
        intruder.close()
        wait_until(lost.is_set, timeout, "the client to see its session LOST")

    def setup(self) -> None:
        admin = KazooClient(hosts=self.server.hosts)
        admin.start(timeout=10)
        admin.ensure_path(self.chroot)
        admin.stop()
        admin.close()

    def teardown(self) -> None:
        for proxy in self._proxies:
            proxy.close()
        for client in self._clients:
            with contextlib.suppress(Exception):
                client.stop()
                client.close()
        if not self.server.running:
            self.server.start()
        admin = KazooClient(hosts=self.server.hosts)
        admin.start(timeout=10)
        admin.delete(self.chroot, recursive=True)
        admin.stop()
        admin.close()


@pytest.fixture
def zk(zk_server: ZooKeeperServer, request: pytest.FixtureRequest) -> Iterator[ZkTest]:
    if not zk_server.running:
        zk_server.start()
    test = ZkTest(zk_server)
    test.setup()
    yield test
    test.teardown()
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:
        print(f"--- ZooKeeper log tail ---\n{zk_server.log_tail()}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    setattr(item, f"rep_{report.when}", report)
