"""The replication protocol's rules on an in-memory primary and backup (tests/support/pair.py): the pure cores the
brokers use, joined by the protocol's own bytes."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.pair import Pair


def test_a_client_settlement_waits_until_the_backup_holds_the_message() -> None:
    p = Pair()
    p.attach()
    token = p.primary.publish(b"one")
    p.send()
    assert token not in p.primary.settled  # on the wire, not yet applied
    p.deliver()
    assert token not in p.primary.settled  # applied, the acknowledgement not read yet
    p.answer()
    assert p.primary.settled == [token] and p.backup.held == {1: b"one"}


def test_catch_up_sends_what_the_backup_lacks_and_drops_what_the_primary_no_longer_has() -> None:
    p = Pair()
    for body in (b"a", b"b", b"c", b"d"):
        p.primary.publish(body)  # no backup yet: settled at once
    assert p.primary.unguarded == ["m1", "m2", "m3", "m4"]
    p.backup.held = {1: b"a", 2: b"b", 9: b"gone"}  # from before a restart: 9 was consumed meanwhile
    p.primary.consume(2)
    p.attach()
    assert set(p.primary.plan.to_send) == {3, 4} and set(p.primary.plan.dequeues) == {2, 9}  # type: ignore[union-attr]
    p.pump()
    assert p.caught_up and p.backup.held == p.primary.queue


def test_positions_an_older_epoch_gave_other_messages_are_replaced_not_skipped() -> None:
    """The new primary assigned 3 and 4 again: the backup's 3 and 4 are the old primary's unconfirmed messages."""
    p = Pair()
    for body in (b"a", b"b", b"new3", b"new4"):
        p.primary.publish(body)
    p.backup.held = {1: b"a", 2: b"b", 3: b"old3", 4: b"old4", 5: b"old5"}
    p.attach(reused_from=3)
    p.pump()
    assert p.backup.held == {1: b"a", 2: b"b", 3: b"new3", 4: b"new4"}


def test_a_message_published_during_catch_up_is_guarded_until_acknowledged() -> None:
    p = Pair()
    for body in (b"a", b"b"):
        p.primary.publish(body)
    p.attach()
    live = p.primary.publish(b"live")
    p.send()
    p.deliver()
    assert live not in p.primary.settled
    p.answer()
    assert live in p.primary.settled and p.caught_up and p.backup.held == p.primary.queue


def test_a_dropped_backup_stops_guarding_and_catches_up_again_on_its_return() -> None:
    p = Pair()
    p.attach()
    t1 = p.primary.publish(b"x")
    p.send()  # lost with the connection
    p.primary.drop()
    assert t1 in p.primary.settled  # nobody guards it any more: the client is answered
    p.attach()
    p.pump()
    assert p.backup.held == {1: b"x"} and p.caught_up


OPS = st.lists(st.sampled_from(["publish", "consume", "send", "deliver", "answer", "drop", "attach"]),
               max_size=60)


@settings(max_examples=300, deadline=None)
@given(OPS, st.data())
def test_any_interleaving_ends_with_the_backup_holding_exactly_the_primarys_queue(ops: list[str],
                                                                                    data: st.DataObject) -> None:
    p = Pair()
    p.attach()
    attached = True
    n = 0
    for op in ops:
        if op == "publish":
            n += 1
            p.primary.publish(f"m{n}".encode())
        elif op == "consume" and p.primary.queue:
            p.primary.consume(data.draw(st.sampled_from(sorted(p.primary.queue))))
        elif op == "send" and attached:
            p.send()
        elif op == "deliver" and attached:
            p.deliver()
        elif op == "answer" and attached:
            p.answer()
        elif op == "drop" and attached:
            p.primary.drop()
            attached = False
        elif op == "attach" and not attached:
            p.attach()
            attached = True
        # The promise at every step: once the backup is caught up (ready), every settled message still on the
        # queue is on the backup (catch-up covered what was there at its snapshot; what came later was guarded)
        if attached and p.caught_up:
            for token in p.primary.settled + p.primary.unguarded:
                pos = int(token[1:])
                assert pos not in p.primary.queue or pos in p.backup.held, (token, ops)
    if not attached:
        p.attach()
    p.pump()
    assert p.caught_up
    assert p.backup.held == p.primary.queue
