"""The whole-cluster restart rule (ha/core/restart.py): the broker it picks holds every confirmed message.

Examples first (the cases the runbook names), then a model of a cluster's history driven by hypothesis: brokers
journal what the real ones journal (ha/node.py, ha/primary.py, ha/backup.py) in the same order, a crash keeps each
journal's synced part and a random part of the rest, and the rule must never pick a broker that lacks a confirmed
message, whichever brokers report, and must promote someone when every broker is back with its journal.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ha.core.membership import Member, Membership
from ha.core.restart import (
    ReadyView,
    RestartAction,
    RestartReason,
    Standing,
    decide_restart,
    may_restart_as_newest,
    newest_view,
)
from ha.core.states import HaState, Role


def view(epoch: int, seq: int, primary: str, *ready: str) -> ReadyView:
    return ReadyView(epoch, seq, primary, frozenset(ready))


# ---- examples ------------------------------------------------------------------------------------------------


def test_the_primary_that_dropped_a_backup_wins_over_it_though_the_backup_is_further_ahead_in_its_record() -> None:
    # b3 was dropped in list 6 (its own journal still says list 5, ready); b1 carried on with b2 only.
    standings = [
        Standing("b1", 3, 120, 3, view(3, 6, "b1", "b2")),
        Standing("b2", 3, 118, 3, view(3, 5, "b1", "b2", "b3")),
        Standing("b3", 3, 200, 3, view(3, 5, "b1", "b2", "b3")),
    ]
    d = decide_restart(standings, expected=3)
    assert (d.action, d.reason, d.winner, d.epoch) == (RestartAction.PROMOTE, RestartReason.NEWEST_STORE, "b1", 4)
    assert d.eligible == ("b1", "b2") and "b1 holds the newest store" in d.describe()


def test_an_older_store_alone_waits_even_after_the_wait_because_the_brokers_its_list_names_are_missing() -> None:
    older = Standing("b3", 3, 90, 3, view(3, 5, "b1", "b2", "b3"))
    d = decide_restart([older], expected=3, waited_out=True)
    assert d.action is RestartAction.WAIT and d.reason is RestartReason.WAITING_FOR_ELIGIBLE
    assert d.missing == ("b1", "b2") and "waiting for b1, b2" in d.describe()


def test_a_broker_from_an_older_epoch_never_wins_over_the_newest_ready_set() -> None:
    standings = [
        Standing("b1", 2, 500, 2, view(2, 9, "b1", "b2")),  # primary of epoch 2, lots of data, then gone
        Standing("b2", 3, 300, 3, view(3, 2, "b2", "b3")),
        Standing("b3", 3, 300, 3, view(3, 2, "b2", "b3")),
    ]
    d = decide_restart(standings, expected=3)
    assert d.action is RestartAction.PROMOTE and d.winner == "b2"  # tie on (epoch, position): the smaller name


def test_a_backup_not_yet_ready_in_the_newest_epoch_is_not_a_candidate() -> None:
    standings = [
        Standing("b1", 4, 50, 4, view(4, 1, "b1")),
        Standing("b2", 4, 400, 3, view(4, 1, "b1")),  # adopted epoch 4, never ready in it
    ]
    d = decide_restart(standings, expected=2)
    assert d.winner == "b1"


def test_brand_new_cluster_only_once_every_broker_reported() -> None:
    fresh = [Standing("b1", 0, 0), Standing("b2", 0, 0)]
    assert decide_restart(fresh, expected=3).action is RestartAction.WAIT
    assert decide_restart(fresh, expected=3, waited_out=True).action is RestartAction.WAIT  # b3 may hold a store
    d = decide_restart([*fresh, Standing("b3", 0, 0)], expected=3)
    assert (d.action, d.winner, d.epoch) == (RestartAction.NEW_CLUSTER, None, 1)


def test_a_fresh_disk_next_to_a_store_never_counts_as_a_new_cluster() -> None:
    d = decide_restart([Standing("b1", 0, 0), Standing("b2", 2, 10, 2, view(2, 3, "b2"))], expected=2)
    assert d.action is RestartAction.PROMOTE and d.winner == "b2"


def test_journals_without_a_member_list_leave_the_choice_to_an_operator() -> None:
    standings = [Standing("b1", 3, 10, 3), Standing("b2", 3, 12, 2)]  # an older release: no view
    assert decide_restart(standings[:1], expected=2).action is RestartAction.WAIT
    d = decide_restart(standings, expected=2)
    assert d.action is RestartAction.OPERATOR and d.reason is RestartReason.NO_READY_VIEW
    assert "--force" in d.describe()


def test_when_every_broker_the_newest_list_names_lost_its_store_an_operator_decides() -> None:
    # b1 and b3 had their disks replaced; b2 was dropped (its journal still has list 4, naming b1 and b3)
    standings = [Standing("b1", 0, 0), Standing("b2", 3, 40, 3, view(3, 4, "b1", "b3")), Standing("b3", 0, 0)]
    d = decide_restart(standings, expected=3)
    assert d.action is RestartAction.OPERATOR and d.reason is RestartReason.NO_ELIGIBLE_UP
    assert "acknowledged messages may be lost" in d.describe()


def test_a_list_only_a_never_ready_backup_kept_with_nothing_stored_anywhere_is_a_new_cluster() -> None:
    # b1 became primary and sent its first list (b3 ready) to b2, then all crashed before b1 or b3 synced anything:
    # nothing was confirmed, nothing is stored (found by the hypothesis test below)
    standings = [Standing("b1", 0, 0), Standing("b2", 1, 0, 0, view(1, 2, "b1", "b3")), Standing("b3", 0, 0)]
    assert decide_restart(standings, expected=3).action is RestartAction.NEW_CLUSTER
    assert decide_restart(standings[:2], expected=3).action is RestartAction.WAIT


def test_after_the_wait_it_decides_without_a_broker_the_newest_list_does_not_name() -> None:
    standings = [Standing("b1", 3, 40, 3, view(3, 4, "b1", "b2")), Standing("b2", 3, 41, 3, view(3, 4, "b1", "b2"))]
    assert decide_restart(standings, expected=3).action is RestartAction.WAIT
    d = decide_restart(standings, expected=3, waited_out=True)
    assert d.action is RestartAction.PROMOTE and d.winner == "b2" and d.missing == ()


def test_two_lists_with_the_same_number_allow_only_the_brokers_both_name() -> None:
    standings = [Standing("b1", 3, 40, 3, view(3, 4, "b1", "b2")), Standing("b2", 3, 50, 3, view(3, 4, "b3", "b2"))]
    v, allowed = newest_view(standings)
    assert allowed == {"b2"} and v is not None and v.key == (3, 4)
    assert decide_restart([*standings, Standing("b3", 3, 60, 3, view(3, 4, "b3", "b2"))], expected=3).winner == "b2"


def test_a_list_its_own_primary_never_journaled_does_not_count() -> None:
    # b1 was promoted (epoch 4) and sent its first lists, then crashed before its journal synced them: it confirmed
    # nothing in epoch 4; its journal says it was ready in epoch 3, with b2.
    standings = [Standing("b1", 3, 50, 3, view(3, 8, "b3", "b1", "b2")),
                 Standing("b2", 4, 50, 3, view(4, 2, "b1")),
                 Standing("b3", 3, 20, 3, view(3, 8, "b3", "b1", "b2"))]
    d = decide_restart(standings, expected=3)
    assert d.newest == view(3, 8, "b3", "b1", "b2") and d.winner == "b1"  # b2's own journal: not ready in (4, 2)
    # a brand-new cluster whose first primary lost its journal before the first sync: nothing was confirmed
    fresh = [Standing("b1", 0, 0), Standing("b2", 1, 0, 0, view(1, 1, "b1"))]
    assert decide_restart(fresh, expected=2).action is RestartAction.NEW_CLUSTER


def test_a_candidate_whose_own_list_drops_it_is_not_picked() -> None:
    # b2's own journal: dropped in list 6; a newer list 7 names it ready again, but b2 never received it.
    standings = [Standing("b1", 3, 10, 3, view(3, 7, "b1", "b2")), Standing("b2", 3, 99, 3, view(3, 6, "b1"))]
    assert decide_restart(standings, expected=2).winner == "b1"


@pytest.mark.parametrize(
    ("ready_epoch", "own", "ok"),
    [
        (0, None, False),
        (3, None, True),  # a journal of an older release: no list
        (3, view(3, 5, "b1", "b2"), True),
        (3, view(3, 6, "b1"), False),  # dropped
        (2, view(3, 1, "b1", "b2"), False),  # named in a list of epoch 3 but never ready in it
        (3, view(2, 9, "b2"), True),
    ],
)
def test_the_brokers_own_check(ready_epoch: int, own: ReadyView | None, ok: bool) -> None:
    assert may_restart_as_newest("b2", ready_epoch, own) is ok


def test_ready_view_of_a_membership_and_its_journaled_form() -> None:
    m = Membership(
        3,
        (
            Member("b1", "h:1", Role.PRIMARY, HaState.ACTIVE),
            Member("b2", "h:2", Role.BACKUP, HaState.READY),
            Member("b3", "h:3", Role.BACKUP, HaState.CATCHUP),
        ),
        seq=7,
    )
    v = ReadyView.of(m)
    assert v == view(3, 7, "b1", "b2")
    assert ReadyView.from_json(v.to_json()) == v
    assert ReadyView.of(Membership(3, (Member("b2", "h:2", Role.BACKUP, HaState.READY),), seq=1)) is None
    for bad in (None, [], {"epoch": 1}, {"epoch": -1, "seq": 0, "primary": "b"}, {"epoch": True, "seq": 0,
                "primary": "b"}, {"epoch": 1, "seq": 1, "primary": ""}, {"epoch": 1, "seq": 1, "primary": "b",
                "ready": [3]}):
        assert ReadyView.from_json(bad) is None


# ---- a model of the cluster's history ------------------------------------------------------------------------
#
# A broker journals its standing as the real one does (HaNode._record_standing): ("state", epoch, ready_epoch, view),
# the whole standing in each record; its messages as ("msg", position, id), and a catch-up as ("log", {position: id})
# (the backup now holds the primary's messages). A journal has a synced part (the primary syncs before it confirms,
# or before it settles without a dropped backup; a backup before it acknowledges); a crash keeps the synced part and
# any prefix of the rest. A record here is one write of the journal (what one event journals in a pass), which
# recovery keeps whole or cuts whole.


@dataclass
class Broker:
    name: str
    journal: list[tuple[object, ...]] = field(default_factory=list)
    synced: int = 0
    alive: bool = True
    attached: bool = False  # following the primary
    has_log: bool = False  # caught up (receives live messages)
    state: str = "joining"  # joining | catchup | ready | primary
    wiped: bool = False
    epoch_file: int = 0  # DATA_DIR/epoch: raised and fsynced at once (EpochStore), not part of the journal

    def replay(self) -> tuple[int, int, ReadyView | None, dict[int, int]]:
        epoch, ready_epoch, v, log = 0, 0, None, {}
        for r in self.journal:
            if r[0] == "state":
                epoch, ready_epoch, v = r[1], r[2], r[3]  # type: ignore[assignment]
            elif r[0] == "msg":
                log[r[1]] = r[2]  # type: ignore[index]
            elif r[0] == "log":
                log = dict(r[1])  # type: ignore[call-overload]
        return epoch, ready_epoch, v, log

    def record(self, epoch: int | None = None, ready_epoch: int | None = None, v: ReadyView | None = None) -> None:
        """One STATE record: the standing as it is now, with what changed."""
        e, r, old, _ = self.replay()
        self.epoch_file = max(self.epoch_file, epoch or 0)
        self.write("state", max(e, epoch or 0), r if ready_epoch is None else ready_epoch, v or old)

    def standing(self) -> Standing:
        epoch, ready_epoch, v, log = self.replay()
        return Standing(self.name, max(epoch, self.epoch_file), max(log, default=0), ready_epoch, v)

    def write(self, *record: object) -> None:
        self.journal.append(record)

    def sync(self) -> None:
        self.synced = len(self.journal)


class Cluster:
    """One history; `step` applies one event the draw picks among those possible now."""

    def __init__(self, n: int) -> None:
        self.brokers = {f"b{i}": Broker(f"b{i}") for i in range(1, n + 1)}
        self.epoch = 0
        self.seq = 0
        self.primary: str | None = None
        self.ready: set[str] = set()  # the primary's current list
        self.pending: dict[str, list[ReadyView]] = {}  # lists sent, not yet received, per backup
        self.all_confirmed: list[tuple[int, int]] = []
        self.next_id = 1
        self.promote(f"b{1}", 1)

    # -- the primary's list
    def current_view(self) -> ReadyView:
        assert self.primary is not None
        return ReadyView(self.epoch, self.seq, self.primary, frozenset(self.ready))

    def new_list(self) -> None:
        self.seq += 1
        v = self.current_view()
        self.brokers[v.primary].record(v=v)
        for name, b in self.brokers.items():
            if b.attached:
                self.pending.setdefault(name, []).append(v)

    def promote(self, name: str, epoch: int) -> None:
        for b in self.brokers.values():
            b.attached, b.has_log = False, False
            if b.state != "primary":
                b.state = "joining"
        self.pending.clear()
        self.epoch, self.seq, self.primary, self.ready = epoch, 0, name, set()
        p = self.brokers[name]
        # HaNode.promote: adopt_epoch (ready_epoch unchanged), then the state change, journaled with the list
        # "primary of this epoch, nobody ready yet" (seq 0), then list 1.
        p.record(epoch=epoch)
        p.record(ready_epoch=epoch, v=ReadyView(epoch, 0, name))
        p.state, p.has_log = "primary", True
        self.new_list()

    # -- events
    def events(self) -> list[str]:
        ev = ["crash_all"]
        p = self.brokers[self.primary] if self.primary else None
        live = [b for b in self.brokers.values() if b.alive]
        if p is not None and p.alive:
            ev += ["publish", "confirm", "crash_primary"]
            ev += [f"attach {b.name}" for b in live if b.state != "primary" and not b.attached]
            ev += [f"catchup {b.name}" for b in live if b.attached and not b.has_log]
            ev += [f"deliver {n}" for n, q in self.pending.items() if q and self.brokers[n].alive]
            ev += [f"drop {n}" for n in sorted(self.ready)]
        ev += [f"crash {b.name}" for b in live if b.state != "primary"]
        ev += [f"restart {b.name}" for b in self.brokers.values() if not b.alive]
        ev += [f"wipe {b.name}" for b in self.brokers.values() if not b.alive and not b.wiped]
        return ev

    def step(self, event: str, cut: st.DataObject) -> None:
        kind, _, name = event.partition(" ")
        b = self.brokers.get(name)
        p = self.brokers[self.primary] if self.primary else None
        if kind == "publish" and p is not None:
            _, _, _, log = p.replay()
            pos, mid = max(log, default=0) + 1, self.next_id
            self.next_id += 1
            p.write("msg", pos, mid)
            for o in self.brokers.values():
                if o.alive and o.attached and o.has_log:
                    o.write("msg", pos, mid)
        elif kind == "confirm" and p is not None:
            if any(not self.brokers[n].alive for n in self.ready):
                return  # it waits for the dead backup until it drops it
            p.sync()
            for n in self.ready:
                self.brokers[n].sync()
            _, _, _, log = p.replay()
            held = [self.brokers[n].replay()[3] for n in self.ready]
            for pos, mid in log.items():
                if all(h.get(pos) == mid for h in held):
                    self.all_confirmed.append((pos, mid))
        elif kind == "attach" and b is not None:
            b.attached, b.state = True, "joining"
            b.record(epoch=self.epoch)  # adopts the epoch (HaNode.adopt_epoch)
            self.pending[b.name] = [self.current_view()]
        elif kind == "catchup" and b is not None and p is not None:
            b.write("log", p.replay()[3])
            b.has_log, b.state = True, "catchup"
            self.ready.add(b.name)  # the primary counts it ready and sends the list (ha/primary.py)
            self.new_list()
        elif kind == "deliver" and b is not None:
            v = self.pending[b.name].pop(0)
            if b.name in v.ready and b.state == "catchup":  # Backup._membership: caught up
                # HaNode.set_membership, then the state change, in the same pass: one write, whole or cut whole
                # (broker/store/records.py last_end), so one record here
                b.state = "ready"
                b.record(ready_epoch=self.epoch, v=v)
            else:
                b.record(v=v)  # HaNode.set_membership
        elif kind == "drop" and b is not None:
            self.ready.discard(b.name)
            b.attached, b.has_log = False, False
            self.pending.pop(b.name, None)
            if b.alive:
                b.state = "joining"
            self.new_list()
            assert p is not None
            p.sync()  # store.when_synced before it settles without it
        elif kind == "crash_primary" and p is not None:
            self.crash(p, cut)
            ready = [o for o in self.brokers.values() if o.alive and o.state == "ready"]
            if ready:  # Pacemaker / the manager: the most current ready backup, with a new epoch
                best = max(ready, key=lambda o: (o.replay()[0], max(o.replay()[3], default=0), o.name))
                self.promote(best.name, self.epoch + 1)
            else:
                self.primary = None
        elif kind == "crash" and b is not None:
            if b.name in self.ready and p is not None and p.alive and cut.draw(st.booleans(), label="dropped"):
                self.step(f"drop {b.name}", cut)
            self.crash(b, cut)
        elif kind == "restart" and b is not None:
            b.alive, b.state, b.attached, b.has_log = True, "joining", False, False
        elif kind == "wipe" and b is not None:
            b.journal, b.synced, b.wiped, b.epoch_file = [], 0, True, 0

    def crash(self, b: Broker, cut: st.DataObject) -> None:
        keep = cut.draw(st.integers(b.synced, len(b.journal)), label=f"{b.name} keeps")
        del b.journal[keep:]
        b.synced = keep
        b.alive, b.attached, b.has_log, b.state = False, False, False, "joining"
        self.pending.pop(b.name, None)

    def crash_all(self, cut: st.DataObject) -> None:
        for b in self.brokers.values():
            if b.alive:
                self.crash(b, cut)
        self.primary = None

    def surviving_confirmed(self) -> set[tuple[int, int]]:
        """Confirmed messages some journal still holds (a replaced disk may have taken the last copy)."""
        held = [set(b.replay()[3].items()) for b in self.brokers.values()]
        return {m for m in self.all_confirmed if any(m in h for h in held)}

    def restart_all(self, d_winner: str, epoch: int) -> None:
        for b in self.brokers.values():
            b.alive, b.state, b.attached, b.has_log = True, "joining", False, False
        self.promote(d_winner, epoch)


def check_outage(c: Cluster, data: st.DataObject) -> tuple[RestartAction, str | None]:
    """After a whole-cluster outage: ask the rule with a random set of reporters, check what it says."""
    n = len(c.brokers)
    names = sorted(c.brokers)
    reporters = data.draw(st.sets(st.sampled_from(names)), label="reporters")
    waited_out = data.draw(st.booleans(), label="waited_out")
    standings = {name: c.brokers[name].standing() for name in names}
    d = decide_restart([standings[r] for r in sorted(reporters)], expected=n, waited_out=waited_out)
    wanted = c.surviving_confirmed()
    if d.action is RestartAction.PROMOTE:
        assert d.winner in reporters
        w = c.brokers[d.winner]
        holds = set(w.replay()[3].items())
        assert wanted <= holds, f"{d.winner} lacks confirmed {sorted(wanted - holds)}: {d.describe()}"
        s = standings[d.winner]
        assert may_restart_as_newest(s.name, s.ready_epoch, s.view)  # the broker accepts what the rule picked
        assert d.epoch > max(standings[r].epoch for r in reporters)
    if d.action is RestartAction.NEW_CLUSTER:
        assert set(reporters) == set(names) and (not wanted or any(b.wiped for b in c.brokers.values()))
    # With every broker back and no disk replaced, someone is promoted (or nothing was ever stored).
    full = decide_restart(standings.values(), expected=n)
    if not any(b.wiped for b in c.brokers.values()):
        assert full.action in (RestartAction.PROMOTE, RestartAction.NEW_CLUSTER), full.describe()
    return full.action, full.winner


@settings(max_examples=400, deadline=None)
@given(st.integers(min_value=2, max_value=4), st.data())
def test_the_rule_never_picks_a_broker_that_lacks_a_confirmed_message(n: int, data: st.DataObject) -> None:
    c = Cluster(n)
    outages = data.draw(st.integers(1, 3), label="outages")
    for _ in range(outages):
        for _ in range(data.draw(st.integers(0, 30), label="steps")):
            event = data.draw(st.sampled_from(c.events()), label="event")
            if event == "crash_all":
                break
            c.step(event, data)
        c.crash_all(data)
        action, winner = check_outage(c, data)
        if action is not RestartAction.PROMOTE or winner is None:
            return
        c.restart_all(winner, max(b.standing().epoch for b in c.brokers.values()) + 1)
