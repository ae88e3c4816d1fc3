"""Unit tests of the pcs command builder behind ``ha-admin pacemaker-setup`` (no cluster needed)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from ha.pacemaker import PacemakerSetup, run_setup, setup_commands, setup_from_options

pytestmark = pytest.mark.pacemaker

SETUP = PacemakerSetup(
    vip="192.168.77.100",
    nic="eth1",
    agent_params={"brokers_url": "n1:5672,n2:5672,n3:5672", "public_url": "192.168.77.100:5672"},
)


def test_commands_edit_a_file_and_push_it_once() -> None:
    cmds = setup_commands(SETUP)
    assert cmds[0] == ["pcs", "cluster", "cib", "understudy-cib.xml"]
    assert cmds[-1] == ["pcs", "cluster", "cib-push", "understudy-cib.xml", "--config"]
    for cmd in cmds[1:-1]:
        # nothing touches the live CIB before the push
        assert cmd[:3] == ["pcs", "-f", "understudy-cib.xml"], cmd


def test_promotable_clone_with_one_promoted_instance_and_notifications() -> None:
    create = setup_commands(SETUP)[1]
    assert create[3:7] == ["resource", "create", "understudy", "ocf:understudy:understudy"]
    assert "brokers_url=n1:5672,n2:5672,n3:5672" in create
    assert create[-3:] == ["promotable", "promoted-max=1", "notify=true"]
    joined = " ".join(create)
    assert "monitor interval=3s role=Promoted" in joined
    assert "monitor interval=4s role=Unpromoted" in joined


def test_vip_colocated_with_promoted_and_ordered_around_promote_and_demote() -> None:
    cmds = [" ".join(c[3:]) for c in setup_commands(SETUP)[2:-1]]
    assert cmds == [
        "resource create understudy-vip ocf:heartbeat:IPaddr2 ip=192.168.77.100 cidr_netmask=24 nic=eth1 "
        "op monitor interval=3s",
        "constraint colocation add understudy-vip with Promoted understudy-clone INFINITY",
        "constraint order promote understudy-clone then start understudy-vip symmetrical=false kind=Mandatory",
        "constraint order demote understudy-clone then stop understudy-vip symmetrical=false kind=Optional",
    ]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"vip": "not-an-ip"}, "not-an-ip"),
        ({"vip_resource": "understudy"}, "different resource ids"),
        ({"cidr_netmask": 33}, "cidr_netmask"),
        ({"agent": "understudy"}, "ocf:PROVIDER:TYPE"),
        ({"agent_params": {"bad name": "x"}}, "bad name"),
        ({"unpromoted_monitor_interval": "3s"}, "must differ"),
        ({"start_timeout": "soon"}, "start_timeout"),
    ],
)
def test_bad_settings_are_refused_with_the_culprit_named(change: dict[str, object], message: str) -> None:
    args: dict[str, object] = {"vip": "10.0.0.1", **change}
    with pytest.raises(ValueError, match=message):
        PacemakerSetup(**args)  # type: ignore[arg-type]


def test_dry_run_prints_every_command_and_runs_none() -> None:
    printed: list[str] = []
    ran: list[list[str]] = []

    def runner(cmd: Sequence[str]) -> int:
        ran.append(list(cmd))
        return 0

    rc = run_setup(setup_commands(SETUP), dry_run=True, echo=printed.append, runner=runner)
    assert rc == 0 and ran == []
    assert len(printed) == len(setup_commands(SETUP))
    assert printed[-1] == "(dry run) pcs cluster cib-push understudy-cib.xml --config"


def test_run_stops_at_first_failure_before_the_push() -> None:
    printed: list[str] = []
    ran: list[list[str]] = []

    def runner(cmd: Sequence[str]) -> int:
        ran.append(list(cmd))
        return 1 if "colocation" in ran[-1] else 0

    rc = run_setup(setup_commands(SETUP), dry_run=False, echo=printed.append, runner=runner)
    assert rc == 1
    assert not any("cib-push" in c for c in ran)
    assert printed[-1].startswith("failed (exit 1)")


@pytest.mark.parametrize(
    ("vip", "brokers_url", "extra", "message"),
    [
        ("notanip", "a:1,b:2", {}, "--vip: 'notanip' is not an IPv4 or IPv6 address"),
        ("10.0.0.9", "nohost", {}, "--brokers-url: 'nohost' is not host:port"),
        ("10.0.0.9", " , ", {}, "--brokers-url: empty"),
        ("10.0.0.9", "a:1,b:2", {"port": 70000}, "--port: expected 1..65535, got 70000"),
        ("10.0.0.9", "a:1,b:2", {"public_url": "::1"}, "--public-url: '::1': an IPv6 address needs brackets"),
        ("10.0.0.9", "a:1,b:2", {"cidr_netmask": 64}, "cidr_netmask must be 1..32 for 10.0.0.9, got 64"),
    ],
)
def test_the_options_of_pacemaker_setup_are_checked_before_any_pcs_command(
        vip: str, brokers_url: str, extra: dict[str, object], message: str) -> None:
    """What the agent's validate-all would refuse (OCF_ERR_CONFIGURED) after the resources were made, or what
    Pacemaker could never run, is refused here with the option named."""
    with pytest.raises(ValueError) as e:
        setup_from_options(vip, brokers_url, **extra)  # type: ignore[arg-type]
    assert str(e.value).startswith(message)


def test_an_ipv6_vip_gets_a_bracketed_public_url_and_a_netmask_up_to_128() -> None:
    setup = setup_from_options("fd00::9", "[fd00::1]:5672,[fd00::2]:5672", cidr_netmask=64)
    assert setup.agent_params["public_url"] == "[fd00::9]:5672"  # "fd00::9:5672" is not host:port for the agent
    assert "cidr_netmask=64" in setup_commands(setup)[2]
