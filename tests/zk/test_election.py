"""The election rules (ha.coordination.election), driven through the in-memory coordinator and the real
CoordinatedRole (on a stand-in node).  No server needed."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ha.coordinated import CoordinatedRole
from ha.coordination.base import ClusterView, MemberRecord, Session, WaitReason
from ha.coordination.election import Action, Reason, decide, next_epoch, should_attempt
from ha.coordination.memory import MemoryCoordinator, MemoryStore
from ha.core.states import HaState
from tests.support.coordinated import Node


class FakeBroker:
    """The real CoordinatedRole (ha.coordinated) on a stand-in node (tests/support/coordinated.py), with what it did
    recorded: each decision, each election won, each leadership lost."""

    def __init__(self, store: MemoryStore, name: str, state: str = "joining", epoch: int = 0,
                 position: int = 0, peers: dict[str, FakeBroker] | None = None) -> None:
        self.peers = peers if peers is not None else {}
        self.peers[name] = self
        self.node = Node(name, immediate=True)
        self.node.state, self.node.epoch, self.node.data_position = HaState(state), epoch, position
        self.coordinator: MemoryCoordinator = store.coordinator(name)
        self.role = CoordinatedRole(self.node, self.coordinator)
        self.decisions: list[tuple[Action, Reason]] = []
        self.elected: list[int] = []
        self.lost = 0
        on_view, on_elected, on_lost = self.role.on_view, self.role.on_elected, self.role.on_lost

        def viewed(view: ClusterView) -> None:
            on_view(view)
            assert self.role.last is not None
            self.decisions.append((self.role.last.action, self.role.last.reason))

        def elected(epoch: int) -> None:
            self.elected.append(epoch)
            on_elected(epoch)

        def lost() -> None:
            self.lost += 1
            on_lost()

        self.role.on_view, self.role.on_elected, self.role.on_lost = viewed, elected, lost  # type: ignore[method-assign]
        self.role.start()

    @property
    def name(self) -> str:
        return self.node.server.id  # type: ignore[no-any-return]

    @property
    def record(self) -> MemberRecord:
        return self.role.record()

    @property
    def paused(self) -> bool:
        return self.role.last is not None and self.role.last.action is Action.PAUSE

    def force_promote(self) -> None:
        self.role.forced = True
        self.coordinator.contend(force=True)

    def set(self, state: str | None = None, epoch: int | None = None, position: int | None = None) -> None:
        n = self.node
        if state is not None:
            n.state = HaState(state)
            if n.state is HaState.READY:
                n.ready_epoch = max(n.ready_epoch, epoch if epoch is not None else n.epoch)
        if epoch is not None:
            n.epoch = epoch
        if position is not None:
            n.data_position = position
        self.role.publish()
        if n.state is HaState.READY:  # as a primary does when a backup becomes ready: it joins the ready set
            for p in self.peers.values():
                if p.node.primary is not None and self.name not in p.node.primary.ready:
                    p.node.primary.ready.append(self.name)
                    p.role.ready_set_changed(p.node.primary.ready_names())


def brokers(store: MemoryStore, *specs: tuple[str, str, int]) -> dict[str, FakeBroker]:
    """Brokers starting at the same moment."""
    peers: dict[str, FakeBroker] = {}
    with store.simultaneously():
        for name, state, pos in specs:
            FakeBroker(store, name, state, epoch=0, position=pos, peers=peers)
    return peers


def test_brand_new_cluster_elects_one_primary_without_any_ready_broker() -> None:
    store = MemoryStore("/understudy/c1")
    b = brokers(store, ("b1", "joining", 0), ("b2", "joining", 0), ("b3", "joining", 0))

    assert store.leader == "b1"  # equal ranks: smallest name
    assert b["b1"].elected == [1]
    assert b["b1"].record.role == "primary" and b["b1"].record.epoch == 1
    assert (Action.CONTEND, Reason.NEW_CLUSTER) in b["b2"].decisions
    # once an epoch exists the cluster is no longer new: the joining brokers stop contending
    assert b["b2"].decisions[-1] == (Action.WITHDRAW, Reason.NOT_READY)
    assert store.snapshot(b["b2"].coordinator).candidates == ("b1",)


def test_the_most_current_ready_backup_succeeds_a_dead_primary() -> None:
    store = MemoryStore()
    b = brokers(store, ("b1", "joining", 0), ("b2", "joining", 0), ("b3", "joining", 0))
    b["b2"].set(state="ready", epoch=1, position=40)
    b["b3"].set(state="ready", epoch=1, position=42)

    store.expire("b1")

    assert b["b1"].lost == 1 and b["b1"].record.role == "backup"  # demoted at once, as its session was lost
    assert store.leader == "b3" and b["b3"].elected == [2]
    assert b["b2"].elected == []


def test_backups_in_catchup_never_win_and_the_view_says_why() -> None:
    store = MemoryStore()
    b = brokers(store, ("b1", "joining", 0), ("b2", "joining", 0), ("b3", "joining", 0))
    b["b2"].set(state="catchup", epoch=1, position=99)
    b["b3"].set(state="joining", epoch=1)

    store.expire("b1")

    view = b["b2"].coordinator.view()
    assert (view.leader, view.reason) == (None, WaitReason.NO_READY_MEMBER)
    assert store.elections == 1
    # One says "ready" now, with no primary to have caught up from: not in the dead primary's ready set, it waits
    b["b3"].set(state="ready")
    assert store.leader is None and b["b3"].elected == []
    assert b["b3"].coordinator.view().reason is WaitReason.NO_CANDIDATE_IN_READY_SET


def test_a_suspended_primary_pauses_and_resumes_with_its_session() -> None:
    store = MemoryStore()
    b = brokers(store, ("b1", "joining", 0), ("b2", "joining", 0))
    primary = b["b1"]
    assert primary.coordinator.holds_lease()

    store.suspend("b1")
    assert primary.paused and not primary.coordinator.holds_lease()
    assert primary.decisions[-1] == (Action.PAUSE, Reason.SESSION_SUSPENDED)
    assert store.leader == "b1", "a suspended session still holds leadership"

    store.resume("b1")
    assert not primary.paused and primary.coordinator.holds_lease()
    assert primary.decisions[-1] == (Action.CARRY_ON, Reason.LEADING)


def test_a_primary_that_woke_up_after_its_session_expired_demotes_and_rejoins() -> None:
    store = MemoryStore()
    b = brokers(store, ("b1", "joining", 0), ("b2", "joining", 0))
    b["b2"].set(state="ready", epoch=1, position=5)
    store.suspend("b1")  # SIGSTOP
    store.expire("b1")  # ... past its session
    assert store.leader == "b2"

    store.reconnect("b1")  # SIGCONT
    assert b["b1"].record.role == "backup"
    assert not b["b1"].coordinator.holds_lease()
    assert b["b1"].coordinator.view().leader == "b2"
    assert b["b1"].elected == [1]


def test_a_stale_ready_backup_outside_the_ready_set_does_not_win() -> None:
    store = MemoryStore()
    b = brokers(store, ("b1", "joining", 0), ("b2", "joining", 0), ("b3", "joining", 0))
    b["b2"].set(state="ready", epoch=1, position=50)  # says ready, but the primary dropped it
    b["b3"].set(state="ready", epoch=1, position=60)
    published: list[bool] = []
    b["b1"].coordinator.publish_ready_set({"b2"}, on_published=lambda: published.append(True))
    assert published == [True]
    b["b3"].set(position=70)

    store.expire("b1")

    assert store.leader == "b2"


def test_no_candidate_in_the_ready_set_means_the_cluster_waits() -> None:
    store = MemoryStore()
    b = brokers(store, ("b1", "joining", 0), ("b2", "joining", 0))
    b["b2"].set(state="ready", epoch=1)
    b["b1"].coordinator.publish_ready_set(set())

    store.expire("b1")

    assert store.leader is None
    assert b["b2"].coordinator.view().reason is WaitReason.NO_CANDIDATE_IN_READY_SET


def test_forced_contention_ignores_readiness_ranking_and_ready_set() -> None:
    store = MemoryStore()
    b = brokers(store, ("b1", "joining", 0), ("b2", "joining", 0))
    b["b2"].set(state="catchup", epoch=1)
    b["b1"].coordinator.publish_ready_set(set())
    store.expire("b1")
    assert store.leader is None

    b["b2"].force_promote()  # operator: ha-admin promote --force

    assert store.leader == "b2" and b["b2"].elected == [2]


def test_withdrawing_leader_is_told_it_lost_and_another_takes_over() -> None:
    store = MemoryStore()
    b = brokers(store, ("b1", "joining", 0), ("b2", "joining", 0))
    b["b2"].set(state="ready", epoch=1)

    b["b1"].coordinator.withdraw()  # e.g. ha-admin demote

    assert b["b1"].lost == 1
    assert store.leader == "b2" and b["b2"].elected == [2]


VIEW = ClusterView(cluster="c1", path="/understudy/c1", leader="b2", epoch=3)
ME = MemberRecord("b1", "h:1", "backup", "ready", epoch=3, position=10)
PRIMARY = replace(ME, role="primary", state="active")


@pytest.mark.parametrize(
    ("me", "view", "expected"),
    [
        (ME, VIEW, (Action.CONTEND, Reason.READY)),
        (replace(ME, state="catchup"), VIEW, (Action.WITHDRAW, Reason.NOT_READY)),
        (replace(ME, state="joining"), VIEW, (Action.WITHDRAW, Reason.NOT_READY)),
        (ME, replace(VIEW, leader="b1", i_am_leader=True), (Action.PROMOTE, Reason.ELECTED)),
        (replace(ME, state="catchup"), replace(VIEW, leader="b1", i_am_leader=True),
         (Action.WITHDRAW, Reason.NOT_READY)),
        (PRIMARY, replace(VIEW, leader="b1", i_am_leader=True), (Action.CARRY_ON, Reason.LEADING)),
        (PRIMARY, replace(VIEW, leader="b1", i_am_leader=True, session=Session.SUSPENDED),
         (Action.PAUSE, Reason.SESSION_SUSPENDED)),
        (PRIMARY, replace(VIEW, session=Session.LOST), (Action.DEMOTE, Reason.SESSION_LOST)),
        (PRIMARY, replace(VIEW, leader="b1", i_am_leader=True, epoch=4), (Action.DEMOTE, Reason.HIGHER_EPOCH)),
        (PRIMARY, VIEW, (Action.DEMOTE, Reason.OTHER_LEADER)),
    ],
)
def test_decide(me: MemberRecord, view: ClusterView, expected: tuple[Action, Reason]) -> None:
    decision = decide(me, view)
    assert (decision.action, decision.reason) == expected
    assert decision.epoch == view.epoch


def test_decide_forced_contends_from_catchup_and_promotes_once_elected() -> None:
    catchup = replace(ME, state="catchup")
    assert decide(catchup, VIEW, forced=True).action is Action.CONTEND
    assert decide(catchup, replace(VIEW, leader="b1", i_am_leader=True), forced=True).action is Action.PROMOTE


def test_should_attempt_only_when_leaderless_and_best() -> None:
    members = (replace(ME, name="b1", position=5), replace(ME, name="b2", position=7))
    view = ClusterView("c1", "/p", leader=None, epoch=3, members=members, candidates=("b1", "b2"))
    assert should_attempt("b2", view)
    assert not should_attempt("b1", view)
    assert should_attempt("b1", view, force=True)
    assert not should_attempt("b2", replace(view, leader="b3"))
    assert not should_attempt("b2", replace(view, candidates=("b1",)))
    assert should_attempt("b1", replace(view, ready_set=frozenset({"b1"})))


def test_next_epoch_is_above_counter_and_every_member() -> None:
    assert next_epoch(0, ()) == 1
    assert next_epoch(4, (replace(ME, epoch=9),)) == 10
    assert next_epoch(12, (replace(ME, epoch=9),)) == 13


# -- restart after a whole-cluster outage (brokers back with their journals) -----------------------------------------


def _restarted_view(**over: object) -> ClusterView:
    base = ClusterView(cluster="c", path="/c", leader=None, epoch=3, ready_set=frozenset({"b2"}),
                       ready_leader="b1", ready_epoch=3)
    return replace(base, **over)  # type: ignore[arg-type]


def _joining(name: str, ready_epoch: int, position: int = 100) -> MemberRecord:
    return MemberRecord(name, f"h{name}:5672", "backup", "joining", epoch=3, position=position,
                        ready_epoch=ready_epoch)


@pytest.mark.parametrize(
    ("name", "ready_epoch", "view_changes", "action"),
    [
        ("b1", 3, {}, Action.CONTEND),  # the last leader, back with its journal
        ("b2", 3, {}, Action.CONTEND),  # a ready backup of it
        ("b3", 3, {}, Action.WITHDRAW),  # ready once in epoch 3, then dropped: not in the ready set
        ("b2", 2, {}, Action.WITHDRAW),  # its store is from an older epoch
        ("b2", 3, {"ready_epoch": 2}, Action.WITHDRAW),  # the ready set is older than the epoch: unknown
        ("b2", 3, {"leader": "b1"}, Action.WITHDRAW),  # someone leads: nothing to restart
        # An election was won since, but its winner never published a ready set (it refused to promote, or died
        # first): it confirmed nothing, so epoch 3's stores are still the newest (the 1000-fault soak's stop: a
        # deposed primary, alone in its ready set, elected while it still withdrew, then nobody could win)
        ("b1", 3, {"epoch": 4}, Action.CONTEND),
        ("b2", 3, {"epoch": 4}, Action.CONTEND),
        ("b3", 3, {"epoch": 4}, Action.WITHDRAW),
        ("b2", 4, {"epoch": 4}, Action.WITHDRAW),  # ready in 4 under a primary that never published: not named
    ],
)
def test_after_a_whole_cluster_outage_only_the_newest_stores_contend(
    name: str, ready_epoch: int, view_changes: dict[str, object], action: Action
) -> None:
    d = decide(_joining(name, ready_epoch), _restarted_view(**view_changes))
    assert d.action is action
    if action is Action.CONTEND:
        assert d.reason is Reason.NEWEST_STORE


def test_the_last_leader_may_win_the_restart_though_it_is_not_in_its_own_ready_set() -> None:
    view = _restarted_view(members=(_joining("b1", 3, position=120), _joining("b2", 3, position=100)),
                           candidates=("b1", "b2"))
    assert should_attempt("b1", view) and not should_attempt("b2", view)


def test_having_won_the_restart_it_promotes() -> None:
    view = _restarted_view(leader="b2", epoch=4, i_am_leader=True)
    assert decide(_joining("b2", 3), view).action is Action.PROMOTE
