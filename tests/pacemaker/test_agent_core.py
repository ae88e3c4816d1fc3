"""Unit tests of the OCF agent's decisions (resource_agents/agent_core.py): exit codes, scores, promote guard."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "resource_agents"))

import agent_core as core
from agent_core import BrokerStatus, PromoteAction

pytestmark = pytest.mark.pacemaker


def backup(state: str, epoch: int = 3, position: int = 100) -> BrokerStatus:
    return BrokerStatus(role="backup", state=state, epoch=epoch, position=position)


PRIMARY = BrokerStatus(role="primary", state="active", epoch=3, position=120)


@pytest.mark.parametrize(
    ("alive", "status", "expected_promoted", "code"),
    [
        (False, None, False, core.OCF_NOT_RUNNING),
        (False, None, True, core.OCF_NOT_RUNNING),
        (True, PRIMARY, True, core.OCF_RUNNING_PROMOTED),
        (True, BrokerStatus("primary", "recovering", 4, 0), True, core.OCF_RUNNING_PROMOTED),
        (True, backup("ready"), False, core.OCF_SUCCESS),
        (True, backup("catchup"), False, core.OCF_SUCCESS),
        (True, backup("joining"), False, core.OCF_SUCCESS),
        # alive but not answering (SIGSTOPped): a failure, never a pass
        (True, None, False, core.OCF_ERR_GENERIC),
        (True, None, True, core.OCF_FAILED_PROMOTED),
        (True, BrokerStatus("standalone", "standalone", 0, 0), False, core.OCF_ERR_GENERIC),
    ],
)
def test_monitor_code(alive: bool, status: BrokerStatus | None, expected_promoted: bool, code: int) -> None:
    assert core.monitor_code(alive, status, expected_promoted) == code


def test_only_ready_backups_and_the_primary_get_a_score() -> None:
    peers = {"n1": PRIMARY}
    assert core.promotion_score("n1", PRIMARY, peers) == core.PRIMARY_SCORE
    assert core.promotion_score("n2", backup("ready"), peers) == core.BEST_READY_SCORE
    assert core.promotion_score("n2", backup("catchup"), peers) is None
    assert core.promotion_score("n2", backup("joining"), peers) is None


def test_ready_backups_are_ranked_by_epoch_then_position() -> None:
    peers = {
        "n1": backup("ready", epoch=3, position=100),
        "n2": backup("ready", epoch=3, position=90),
        "n3": backup("ready", epoch=2, position=500),  # bigger position, older epoch: behind
        "n4": backup("catchup", epoch=9, position=900),  # not ready: does not count
    }
    scores = {n: core.promotion_score(n, s, peers) for n, s in peers.items()}
    assert scores["n1"] is not None and scores["n2"] is not None and scores["n3"] is not None
    assert scores["n1"] > scores["n2"] > scores["n3"] > 0
    assert scores["n4"] is None


def test_equal_currency_gets_equal_score() -> None:
    peers = {"n1": backup("ready"), "n2": backup("ready")}
    assert core.promotion_score("n1", peers["n1"], peers) == core.promotion_score("n2", peers["n2"], peers)


def test_bootstrap_score_only_for_a_brand_new_cluster_while_nobody_serves() -> None:
    fresh = {"n1": backup("joining", 0, 0), "n2": backup("joining", 0, 0)}
    assert core.promotion_score("n1", fresh["n1"], fresh) == core.BOOTSTRAP_SCORE
    serving = {**fresh, "n3": backup("ready")}
    assert core.promotion_score("n1", fresh["n1"], serving) is None
    # after a total outage (epoch > 0) nobody bootstraps: the operator picks the newest data
    restarted = {"n1": backup("joining", 4, 10), "n2": backup("joining", 4, 12)}
    assert core.promotion_score("n1", restarted["n1"], restarted) is None
    # a backup in catchup never bootstraps: its primary existed a moment ago
    assert core.promotion_score("n1", backup("catchup"), {"n1": backup("catchup")}) is None


def test_a_ready_backup_that_lost_its_primary_is_promoted_without_force() -> None:
    orphan = backup("ready", epoch=3, position=100)  # the broker stays ready when its primary vanishes
    eff = core.effective_status(orphan, core.ReadyMark(epoch=3, at=1000.0), now=1005.0)
    assert eff == orphan
    assert core.promotion_score("n2", eff, {"n2": eff}) == core.BEST_READY_SCORE
    d = core.decide_promote("n2", eff, {"n2": eff})
    assert d.action is PromoteAction.PROMOTE and not d.force and d.epoch == 4


def test_the_only_broker_of_a_one_broker_cluster_is_always_a_candidate() -> None:
    alone = backup("joining", epoch=2, position=10)
    assert core.effective_status(alone, None, now=0.0) == alone
    eff = core.effective_status(alone, None, now=0.0, sole_member=True)
    assert eff.is_ready_backup and eff.lost_primary
    assert core.decide_promote("n1", eff, {}).force


@pytest.mark.parametrize(
    ("status", "mark", "now"),
    [
        (backup("joining", epoch=3), core.ReadyMark(epoch=3, at=1000.0), 1000.0 + core.READY_MARK_WINDOW + 1),
        (
            backup("joining", epoch=4),
            core.ReadyMark(epoch=3, at=1000.0),
            1001.0,
        ),  # a new primary came and went
        (backup("catchup", epoch=3), core.ReadyMark(epoch=3, at=1000.0), 1001.0),  # reconnected, catching up
        (backup("joining", epoch=3), None, 1001.0),
        # a backup back in joining within the window: maybe dropped by a primary that carried on without it
        (backup("joining", epoch=3), core.ReadyMark(epoch=3, at=1000.0), 1005.0),
    ],
)
def test_no_ready_mark_no_candidate(status: BrokerStatus, mark: core.ReadyMark | None, now: float) -> None:
    eff = core.effective_status(status, mark, now)
    assert eff == status
    assert core.promotion_score("n2", eff, {"n2": eff, "n3": backup("ready")}) is None


def test_promote_the_most_current_ready_backup() -> None:
    published = {"n2": backup("ready", position=100), "n3": backup("ready", position=90)}
    d = core.decide_promote("n2", published["n2"], published)
    assert d.action is PromoteAction.PROMOTE
    assert d.epoch == 4 and not d.force


def test_promote_behind_another_ready_node_aborts_in_its_favour() -> None:
    published = {"n2": backup("ready", position=90), "n3": backup("ready", position=100)}
    d = core.decide_promote("n2", published["n2"], published)
    assert d.action is PromoteAction.ABORT_FOR_BETTER
    assert d.better_node == "n3"
    assert "position 100" in d.reason


def test_newer_epoch_beats_larger_position() -> None:
    published = {"n2": backup("ready", epoch=2, position=900), "n3": backup("ready", epoch=3, position=1)}
    assert core.decide_promote("n2", published["n2"], published).better_node == "n3"


def test_promote_from_catchup_is_refused() -> None:
    published = {"n2": backup("catchup", epoch=5, position=999), "n3": backup("ready")}
    d = core.decide_promote("n2", published["n2"], published)
    assert d.action is PromoteAction.REFUSE
    assert "catchup" in d.reason


def test_promote_refused_while_another_primary_exists() -> None:
    published = {"n1": PRIMARY, "n2": backup("ready")}
    assert core.decide_promote("n2", published["n2"], published).action is PromoteAction.REFUSE


def test_promote_of_the_primary_is_a_no_op() -> None:
    assert core.decide_promote("n1", PRIMARY, {"n1": PRIMARY}).action is PromoteAction.ALREADY_PRIMARY


def test_bootstrap_promote_prefers_the_newest_data() -> None:
    published = {
        "n1": backup("joining", 0, 50),
        "n2": backup("joining", 0, 70),
        "n3": backup("joining", 0, 9),
    }
    assert core.decide_promote("n1", published["n1"], published).better_node == "n2"
    d = core.decide_promote("n2", published["n2"], published)
    assert d.action is PromoteAction.PROMOTE and not d.force and d.epoch == 1


def test_promote_after_a_total_outage_is_refused() -> None:
    published = {"n1": backup("joining", 3, 50), "n2": backup("joining", 3, 70)}
    assert core.decide_promote("n2", published["n2"], published).action is PromoteAction.REFUSE


def test_ties_pick_the_same_node_everywhere() -> None:
    published = {
        "n1": backup("ready", position=10),
        "n2": backup("ready", position=20),
        "n3": backup("ready", position=20),
    }
    assert core.decide_promote("n1", published["n1"], published).better_node == "n2"


def test_a_ready_backup_holding_an_older_member_list_is_ranked_below_one_holding_a_newer_list() -> None:
    """Within an epoch the member list a backup holds ranks before its position: a backup its primary dropped
    (older list) lacks what the primary settled afterwards, though no publish may have moved the positions; and one
    with a newer list holds everything settled, whatever it has not acknowledged yet."""
    dropped = BrokerStatus("backup", "ready", 3, 100, view=4)
    kept = BrokerStatus("backup", "ready", 3, 100, view=5)
    ahead_but_older = BrokerStatus("backup", "ready", 3, 130, view=4)
    newer_epoch = BrokerStatus("backup", "ready", 4, 0, view=1)
    published = {"n1": dropped, "n2": kept}
    d = core.decide_promote("n1", dropped, published)
    assert d.action is PromoteAction.ABORT_FOR_BETTER and d.better_node == "n2"
    assert "member list 5" in d.reason
    assert core.decide_promote("n2", kept, published).action is PromoteAction.PROMOTE
    assert core.decide_promote("n3", ahead_but_older, {**published, "n3": ahead_but_older}).better_node == "n2"
    assert core.decide_promote("n2", kept, {**published, "n4": newer_epoch}).better_node == "n4"
    scores = {n: core.promotion_score(n, s, published) for n, s in published.items()}
    assert scores["n2"] == core.BEST_READY_SCORE and scores["n1"] == core.BEST_READY_SCORE - core.RANK_STEP


def test_the_member_list_a_status_answer_names_counts_only_within_its_epoch() -> None:
    base = {"role": "backup", "state": "ready", "epoch": 3, "position": 9}
    assert core.status_from({**base, "ready_view": {"epoch": 3, "seq": 7, "primary": "b1"}}).view == 7
    assert core.status_from({**base, "ready_view": {"epoch": 2, "seq": 7, "primary": "b1"}}).view == 0
    assert core.status_from({**base, "ready_view": None}).view == 0
    assert core.status_from({**base, "ready_view": {"epoch": 3, "seq": "7"}}).view == 0
    assert core.status_from(base).view == 0


def test_status_round_trip_and_bad_input() -> None:
    lost = BrokerStatus("backup", "ready", 3, 8, lost_primary=True, view=2)
    assert lost.encode() == "backup:ready:3:8:2:lost" and BrokerStatus.decode(lost.encode()) == lost
    # an agent of an older release publishes role:state:epoch:position[:lost]: no member list
    assert BrokerStatus.decode("backup:ready:3:8:lost") == BrokerStatus("backup", "ready", 3, 8, lost_primary=True)
    assert BrokerStatus.decode("backup:ready:3:8") == BrokerStatus("backup", "ready", 3, 8)
    for bad in ("backup:ready:3", "backup:ready:3:8:2:1", "backup:ready:3:8:x", "lost"):
        with pytest.raises(ValueError):
            BrokerStatus.decode(bad)
    s = backup("ready", 7, 42)
    assert BrokerStatus.decode(s.encode()) == s
    assert core.decode_published({"n1": s.encode(), "n2": "garbage"}) == {"n1": s}
    with pytest.raises(ValueError, match="unexpected status answer"):
        core.status_from({"role": "backup"})
    with pytest.raises(ValueError, match="unexpected status answer"):
        core.status_from(["backup"])
    q = core.status_from(
        {"name": "b1", "address": "h:1", "role": "backup", "state": "ready", "epoch": 2, "position": 9,
         "brokers_url": "h:1", "public_url": None, "members": []}
    )  # fmt: skip
    assert q == backup("ready", 2, 9)


def test_parse_attrd_query() -> None:
    text = 'name="understudy-status-u" host="node1" value="backup:ready:1:5"\nname="understudy-status-u" host="node2" value=""\n'
    assert core.parse_attrd_query(text) == {"node1": "backup:ready:1:5"}


GOOD = {
    "brokers_url": "n1:5672,n2:5672",
    "port": "5672",
    "monitor_timeout": "5",
    "data_dir": "/var/lib/understudy",
}


@pytest.mark.parametrize(
    ("change", "culprit"),
    [
        ({"port": "0"}, "port"),
        ({"port": "http"}, "port"),
        ({"brokers_url": ""}, "brokers_url"),
        ({"brokers_url": "n1:5672,n2"}, "brokers_url"),
        ({"public_url": "vip"}, "public_url"),
        ({"monitor_timeout": "-1"}, "monitor_timeout"),
        ({"monitor_timeout": "soon"}, "monitor_timeout"),
        ({"data_dir": "relative/dir"}, "data_dir"),
        ({"options": "--unbalanced 'quote"}, "options"),
        ({"admin_socket": "relative.sock"}, "admin_socket"),
        ({"data_dir": "/" + "d" * 100}, "admin_socket"),
        ({"ssl_cert": "server.pem", "ssl_key": "/k.pem", "ssl_ca": "/ca.pem"}, "ssl_cert"),
        ({"ssl_cert": "/s.pem"}, "ssl_cert"),
        ({"ssl_cert": "/s.pem", "ssl_key": "/k.pem"}, "ssl_ca"),
        ({"ssl_ca": "/ca.pem"}, "ssl_ca"),
        ({"ssl_require_client_cert": "true"}, "ssl_require_client_cert"),
        ({"ssl_key_password_file": "/pw"}, "ssl_key_password_file"),
        ({"ssl_cert": "/s.pem", "ssl_key": "/k.pem", "ssl_ca": "/ca.pem", "ssl_key_password_file": "pw"},
         "ssl_key_password_file"),
        ({"ssl_cert": "/s.pem", "ssl_key": "/k.pem", "ssl_ca": "/ca.pem", "ssl_require_client_cert": "maybe"},
         "ssl_require_client_cert"),
    ],
)
def test_check_values_names_the_bad_parameter(change: dict[str, str], culprit: str) -> None:
    assert core.check_values(GOOD) == []
    problems = core.check_values({**GOOD, **change})
    assert problems and all(p.code == core.OCF_ERR_CONFIGURED for p in problems)
    assert problems[0].message.startswith(culprit)


def test_broker_command_starts_a_backup_with_the_contract_flags() -> None:
    cmd = core.broker_command(
        {**GOOD, "public_url": "10.0.0.100:5672", "options": "--ha-heartbeat 1"}, "ha-broker", "node1"
    )
    assert cmd[:2] == ["ha-broker", "--ha-cluster"]
    joined = " ".join(cmd)
    for part in (
        "--name node1",
        "--port 5672",
        "--pid-file /var/lib/understudy/broker.pid",
        "--admin-socket /var/lib/understudy/admin.sock",
        "--ha-brokers-url n1:5672,n2:5672",
        "--ha-public-url 10.0.0.100:5672",
    ):
        assert part in joined
    assert cmd[-2:] == ["--ha-heartbeat", "1"]
    assert core.admin_socket({**GOOD, "admin_socket": "/run/u.sock"}) == "/run/u.sock"


def test_broker_command_passes_the_tls_parameters() -> None:
    tls = {"ssl_cert": "/etc/u/s.pem", "ssl_key": "/etc/u/s.key", "ssl_ca": "/etc/u/ca.pem",
           "ssl_key_password_file": "/etc/u/s.pw"}
    assert core.check_values({**GOOD, **tls, "ssl_require_client_cert": "true"}) == []
    joined = " ".join(core.broker_command({**GOOD, **tls, "ssl_require_client_cert": "true"}, "ha-broker", "n1"))
    for part in ("--ssl-cert /etc/u/s.pem", "--ssl-key /etc/u/s.key", "--ssl-ca /etc/u/ca.pem",
                 "--ssl-key-password-file /etc/u/s.pw", "--ssl-require-client-cert"):
        assert part in joined
    plain = " ".join(core.broker_command({**GOOD, **tls, "ssl_require_client_cert": "false"}, "ha-broker", "n1"))
    assert "--ssl-cert" in plain and "--ssl-require-client-cert" not in plain
    assert "--ssl" not in " ".join(core.broker_command(GOOD, "ha-broker", "n1"))


# ---- whole-cluster restart (the newest store) ------------------------------------------------------------------


def _standings() -> dict[str, core.Standing]:
    v_new = core.ReadyView(3, 6, "b1", frozenset({"b2"}))  # b3 was dropped in list 6
    v_old = core.ReadyView(3, 5, "b1", frozenset({"b2", "b3"}))
    return {
        "n1": core.Standing("b1", 3, 120, 3, v_new),
        "n2": core.Standing("b2", 3, 118, 3, v_new),
        "n3": core.Standing("b3", 3, 200, 3, v_old),
    }


JOINING = backup("joining", epoch=3, position=100)


def test_after_a_whole_cluster_outage_only_the_node_of_the_newest_store_gets_a_score() -> None:
    published = {n: JOINING for n in ("n1", "n2", "n3")}
    scores = {}
    for node in ("n1", "n2", "n3"):
        r = core.whole_cluster_restart(node, JOINING, published, _standings(), expected=3)
        assert r is not None and r.winner_node == "n1"
        scores[node] = core.promotion_score(node, JOINING, published, r)
    assert scores == {"n1": core.NEWEST_STORE_SCORE, "n2": None, "n3": None}


def test_while_a_node_has_not_published_its_standing_nobody_gets_a_score_or_is_promoted() -> None:
    standings = {n: s for n, s in _standings().items() if n != "n1"}
    published = {"n2": JOINING, "n3": JOINING}
    r = core.whole_cluster_restart("n3", JOINING, published, standings, expected=3)
    assert r is not None and r.decision.action is core.RestartAction.WAIT
    assert core.promotion_score("n3", JOINING, published, r) is None
    d = core.decide_promote("n3", JOINING, published, r)
    assert d.action is PromoteAction.REFUSE and "waiting" in d.reason


def test_the_promote_of_the_newest_store_says_so_and_another_node_aborts_for_it() -> None:
    published = {n: JOINING for n in ("n1", "n2", "n3")}
    r = core.whole_cluster_restart("n1", JOINING, published, _standings(), expected=3)
    d = core.decide_promote("n1", JOINING, published, r)
    assert (d.action, d.newest_store, d.force, d.epoch) == (PromoteAction.PROMOTE, True, False, 4)
    other = core.decide_promote("n3", JOINING, published, r)
    assert other.action is PromoteAction.ABORT_FOR_BETTER and other.better_node == "n1"


def test_no_restart_rule_while_a_broker_serves() -> None:
    published = {"n1": PRIMARY, "n2": JOINING}
    assert core.whole_cluster_restart("n2", JOINING, published, _standings(), expected=3) is None
    assert core.whole_cluster_restart("n2", backup("ready"), {}, _standings(), expected=3) is None


def test_a_joining_brokers_status_gives_its_standing() -> None:
    s = core.standing_from({"name": "b2", "epoch": 3, "position": 7, "ready_epoch": 3,
                            "ready_view": {"epoch": 3, "seq": 2, "primary": "b1", "ready": ["b2"]}}, "node2")
    assert s == core.Standing("b2", 3, 7, 3, core.ReadyView(3, 2, "b1", frozenset({"b2"})))
    with pytest.raises(ValueError, match="unexpected status answer"):
        core.standing_from({"epoch": "x"}, "node2")


def test_a_ready_backup_its_primary_dropped_is_not_promoted_while_the_newer_list_is_down() -> None:
    """b3 was dropped in list 6 and stayed `ready` with list 5 (a ready backup that loses its primary stays ready);
    b1 (the primary) and b2 confirmed messages under list 6, then both brokers were killed, their nodes up: their
    agents publish their journals' standings. b3 gets no score and refuses a promote; b1's node, restarted
    joining, gets the restart rule's score (the ready b3 does not count as serving)."""
    stale = BrokerStatus(role="backup", state="ready", epoch=3, position=200, view=5)
    standings = _standings()
    published = {"n3": stale}
    assert core.promotion_score("n3", stale, published, None, standings, "b3") is None
    d = core.decide_promote("n3", stale, published, None, standings, "b3")
    assert d.action is PromoteAction.REFUSE and "dropped" in d.reason and "list 6" in d.reason
    published = {"n1": JOINING, "n2": JOINING, "n3": stale}
    r = core.whole_cluster_restart("n1", JOINING, published, standings, expected=3)
    assert r is not None and r.winner_node == "n1"
    assert core.promotion_score("n1", JOINING, published, r, standings, "b1") == core.NEWEST_STORE_SCORE
    # b2, which holds list 6, ranks as before; and b3 too, with nobody down holding a newer list
    current = BrokerStatus(role="backup", state="ready", epoch=3, position=118, view=6)
    assert core.promotion_score("n2", current, {"n2": current}, None, standings, "b2") == core.BEST_READY_SCORE
    older = {n: s for n, s in standings.items() if n == "n3"}
    assert core.promotion_score("n3", stale, published, None, older, "b3") == core.BEST_READY_SCORE


def test_a_new_cluster_whose_first_primary_crashed_before_its_first_sync_gets_a_primary() -> None:
    """Every broker adopted epoch 1 from the first primary, which crashed before its journal held anything: no
    journal holds a store (the restart rule says NEW_CLUSTER), yet none is brand new (epoch 0). The nodes get the
    bootstrap score and the promote forces (nothing was confirmed); it stayed without a primary."""
    adopted = backup("joining", epoch=1, position=0)
    standings = {n: core.Standing(f"b{n[-1]}", 1, 0) for n in ("n1", "n2", "n3")}
    published = {n: adopted for n in standings}
    r = core.whole_cluster_restart("n1", adopted, published, standings, expected=3)
    assert r is not None and r.decision.action is core.RestartAction.NEW_CLUSTER
    assert core.promotion_score("n1", adopted, published, r, standings, "b1") == core.BOOTSTRAP_SCORE
    d = core.decide_promote("n1", adopted, published, r, standings, "b1")
    assert (d.action, d.force, d.epoch) == (PromoteAction.PROMOTE, True, 2)
    assert core.promotion_score("n1", adopted, published, None) is None  # without the journals: no
