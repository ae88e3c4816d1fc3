"""The real CoordinatedRole (ha.coordinated) driven through the in-memory coordinator, without a Server: it sees its
broker only through `NodeSide`, so a small stand-in node is enough (tests/support/coordinated.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from ha.coordinated import CoordinatedRole
from ha.coordination.election import Action, Decision, Reason
from ha.coordination.memory import MemoryCoordinator, MemoryStore
from ha.core.states import HaState
from tests.support.coordinated import Node, Primary


def start(store: MemoryStore, name: str) -> tuple[Node, CoordinatedRole]:
    node = Node(name)
    role = CoordinatedRole(node, store.coordinator(name))
    role.start()
    node.run()
    return node, role


def settle(store: MemoryStore, *nodes: Node) -> None:
    """Deliver everything queued, until nothing more happens."""
    for _ in range(20):
        for n in nodes:
            n.run()
        store.reconcile()
        if not any(n.calls for n in nodes):
            return


def test_a_new_primary_settles_nothing_before_its_epochs_ready_set_is_published() -> None:
    store = MemoryStore()
    node, role = start(store, "b1")
    settle(store, node)
    assert node.primary is not None and node.epoch == 1
    assert store.ready_epoch == 1 and store.ready_leader == "b1"  # published at the promotion
    assert role.published_epoch == 1 and role.may_settle()

    # a later promotion, before the coordinator confirmed the publication: held until it does
    node.demote("test")
    role.published_epoch = 0
    node.primary, node.epoch = Primary(), 2
    assert not role.may_settle()


def test_promotion_takes_newest_store_from_the_rule_not_from_the_last_decision() -> None:
    """The 1000-fault soak's stop: a deposed primary, alone in its ready set, elected again while its last
    decision was still the withdrawal of its demotion, refused to promote and left the cluster without a primary."""
    store = MemoryStore()
    node, role = start(store, "b1")
    settle(store, node)
    assert node.primary is not None and store.ready_set == frozenset() and store.ready_leader == "b1"
    store.expire("b1")  # cut off: deposed; nobody else was ready with it
    settle(store, node)
    assert node.primary is None and node.state == HaState.JOINING
    role.last = Decision(Action.WITHDRAW, Reason.NOT_READY, 1)  # what it decided while being deposed
    store.reconnect("b1")
    settle(store, node)
    assert node.primary is not None, node.promotions
    assert node.promotions[-1][2] is True  # promoted with the newest store (its journal holds everything)
    assert node.epoch == 2 and store.ready_epoch == 2 and role.may_settle()


def test_only_the_newest_store_takes_over_when_nobody_was_ready() -> None:
    store = MemoryStore()
    n1, _ = start(store, "b1")
    settle(store, n1)
    n2, _ = start(store, "b2")  # joining: not in b1's ready set, never a candidate
    settle(store, n1, n2)
    store.expire("b1")
    settle(store, n1, n2)
    assert store.leader is None and n2.promotions == []
    store.reconnect("b1")
    settle(store, n1, n2)
    assert store.leader == "b1" and n1.primary is not None and n2.primary is None


class Replacing(MemoryCoordinator):
    """As ZooKeeperCoordinator: one pending ready-set request, replaced by the next, written when the test says."""

    def __init__(self, store: MemoryStore, name: str) -> None:
        super().__init__(store, name)
        store._coordinators[name] = self  # as MemoryStore.coordinator registers its own
        self.pending: tuple[frozenset[str], Callable[[], None] | None] | None = None

    def publish_ready_set(self, names: Iterable[str], on_published: Callable[[], None] | None = None) -> None:
        self.pending = (frozenset(names), on_published)

    def write(self) -> None:
        assert self.pending is not None
        names, done = self.pending
        self.pending = None
        super().publish_ready_set(names, done)


def promoted_with_replacing() -> tuple[MemoryStore, Replacing, Node, CoordinatedRole]:
    """b1 promoted on a `Replacing` coordinator, the promotion's ready set written."""
    store = MemoryStore()
    coordinator = Replacing(store, "b1")
    node = Node("b1")
    role = CoordinatedRole(node, coordinator)
    role.start()
    settle(store, node)
    coordinator.write()  # the promotion's ready set
    settle(store, node)
    return store, coordinator, node, role


def test_what_waited_for_a_replaced_ready_set_runs_when_a_later_one_is_published() -> None:
    """The 1000-fault soak's second stop: a dropped backup's settlements waited for a ready set without it; the
    request was replaced (another backup became ready) before ZooKeeper had it, the wait was lost, and every resend
    of those messages waited behind them for ever."""
    store, coordinator, node, role = promoted_with_replacing()
    released: list[str] = []
    role.ready_set_changed([], lambda: released.append("b2's settlements"))  # b2 dropped
    role.ready_set_changed(["b3"])  # b3 ready before that reached ZooKeeper: it replaces the request
    assert released == []
    coordinator.write()
    settle(store, node)
    assert released == ["b2's settlements"] and store.ready_set == frozenset({"b3"})
    role.ready_set_changed([], lambda: released.append("b3's"))  # a later wait runs only with a later set
    assert released == ["b2's settlements"]
    coordinator.write()
    settle(store, node)
    assert released == ["b2's settlements", "b3's"]


def test_nothing_is_settled_while_the_published_ready_set_names_a_backup_no_longer_ready() -> None:
    """The 300-fault run of 2026-11-26 15:05 (seed 2611261): a primary cut off for 0.5 s lost backup b2, answered a
    consumer's accept (and settled publishes) without it before ZooKeeper had a ready set without b2; b2 was then
    elected, without that dequeue, and delivered the accepted message again."""
    store, coordinator, node, role = promoted_with_replacing()
    assert node.primary is not None
    node.primary.ready = ["b2"]
    role.ready_set_changed(["b2"])
    coordinator.write()
    settle(store, node)
    assert role.published_names == {"b2"} and role.may_settle()

    node.primary.ready = []  # b2 lost (its browser gone, or the connection): ZooKeeper still says it is ready
    assert not role.may_settle()
    assert role.held() == "ZooKeeper's ready set still names b2, no longer ready"
    assert coordinator.pending is not None and coordinator.pending[0] == frozenset()  # asked for, once
    coordinator.pending = None
    assert not role.may_settle() and coordinator.pending is None  # not asked again while that request is out
    role.ready_set_changed([])  # what Primary._drop_backup asks (a request the coordinator had not written)
    coordinator.write()
    settle(store, node)
    assert store.ready_set == frozenset() and role.may_settle()

    node.primary.ready = ["b3"]  # a backup that became ready: settling with it at once is safe
    assert role.may_settle()


def test_a_primary_hands_out_nothing_while_its_lease_is_in_doubt() -> None:
    """Dispatch is fenced by the lease alone: suspended, nothing; reconnected within the session, at once again
    (the ready-set conditions of `may_settle` do not hold deliveries back)."""
    store = MemoryStore()
    node, role = start(store, "b1")
    assert role.may_dispatch()  # not primary yet: nothing of clients' to hold
    settle(store, node)
    assert node.primary is not None and role.may_dispatch()
    role.published_epoch = 0  # a ready set not yet confirmed holds settlements, not deliveries
    assert not role.may_settle() and role.may_dispatch()
    store.suspend("b1")
    assert not role.may_dispatch()
    store.resume("b1")
    settle(store, node)
    assert role.may_dispatch()


def test_ha_status_is_told_why_settlements_wait() -> None:
    store = MemoryStore()
    node, role = start(store, "b1")
    assert role.held() is None  # not primary
    settle(store, node)
    assert node.primary is not None and role.held() is None
    store.suspend("b1")
    assert (role.held() or "").startswith("no ZooKeeper lease")
    store.resume("b1")
    settle(store, node)
    assert role.held() is None
    role.published_epoch = 0
    assert role.held() == "ZooKeeper does not hold the ready set of epoch 1 yet"
