"""broker.auth.admit: the role of a connection comes from who logged in; its properties only ask."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.auth import ANONYMOUS, KIND_PROPERTY, Kind, Trust, User, admit, certificate_name

USERS = {
    "alice": User("alice", "a", admin=True),
    "bob": User("bob", "b", admin=False),
    "replicator": User("replicator", "r", admin=False),  # an admin through being the replication user
}
SECURED = Trust.of(USERS, "replicator")  # a users file and a replication user
CREDENTIALS_ONLY = Trust.of({}, "replicator")  # no users file: the brokers' own credentials
OPEN = Trust.of({}, None)  # nothing authenticated (development on loopback)
TRUSTS = {"secured": SECURED, "credentials-only": CREDENTIALS_ONLY, "open": OPEN}
IDENTITIES = (None, ANONYMOUS, "alice", "bob", "replicator", "mallory")


def asking(kind: Any) -> dict[str, Any]:
    return {KIND_PROPERTY: kind}


# What each identity may be, whatever it asks: (trust, user) -> (kinds it can get, admin flag).
ALLOWED = {
    ("secured", None): ({Kind.CLIENT}, False),
    ("secured", ANONYMOUS): ({Kind.CLIENT}, False),
    ("secured", "alice"): ({Kind.CLIENT, Kind.ADMIN}, True),
    ("secured", "bob"): ({Kind.CLIENT}, False),
    ("secured", "replicator"): ({Kind.CLIENT, Kind.ADMIN, Kind.HA}, True),
    ("secured", "mallory"): ({Kind.CLIENT}, False),
    ("credentials-only", None): ({Kind.CLIENT, Kind.ADMIN}, True),
    ("credentials-only", ANONYMOUS): ({Kind.CLIENT, Kind.ADMIN}, True),
    ("credentials-only", "alice"): ({Kind.CLIENT, Kind.ADMIN}, True),
    ("credentials-only", "bob"): ({Kind.CLIENT, Kind.ADMIN}, True),
    ("credentials-only", "replicator"): ({Kind.CLIENT, Kind.ADMIN, Kind.HA}, True),
    ("credentials-only", "mallory"): ({Kind.CLIENT, Kind.ADMIN}, True),
    **{("open", u): ({Kind.CLIENT, Kind.ADMIN, Kind.HA}, True) for u in IDENTITIES},
}


@pytest.mark.parametrize("user", [None, ANONYMOUS, "alice", "bob", "mallory"])
def test_only_the_replication_user_may_be_a_backup_once_it_is_configured(user: str | None) -> None:
    for trust in (SECURED, CREDENTIALS_ONLY):
        a = admit(trust, user, asking("ha"))
        assert a.kind == Kind.CLIENT
        assert a.refusal is not None and "'replicator'" in a.refusal and "may not connect as a backup" in a.refusal
    assert admit(SECURED, "replicator", asking("ha")).kind == Kind.HA
    assert admit(CREDENTIALS_ONLY, "replicator", asking("ha")).refusal is None


def test_the_refusal_names_who_asked() -> None:
    anon = admit(SECURED, ANONYMOUS, asking("ha")).refusal
    assert anon is not None and anon.startswith("an ANONYMOUS login may not")
    bob = admit(SECURED, "bob", asking("ha")).refusal
    assert bob is not None and bob.startswith("user 'bob' may not")


def test_a_non_admin_asking_for_admin_is_a_client_not_refused() -> None:
    """Tools ask for `admin` by default (broker.client); a read-only user may still read, but gets no exemption."""
    for user in (None, ANONYMOUS, "bob"):
        a = admit(SECURED, user, asking("admin"))
        assert (a.kind, a.admin, a.refusal) == (Kind.CLIENT, False, None)
    assert admit(SECURED, "alice", asking("admin")).kind == Kind.ADMIN
    assert admit(SECURED, "replicator", asking("admin")).kind == Kind.ADMIN


def test_without_any_authentication_everyone_may_replicate() -> None:
    assert OPEN.open_replication and not CREDENTIALS_ONLY.open_replication and not SECURED.open_replication
    assert admit(OPEN, ANONYMOUS, asking("ha")).kind == Kind.HA


def test_a_users_file_without_a_replication_user_lets_nobody_replicate() -> None:
    trust = Trust.of(USERS, None)
    for user in IDENTITIES:
        assert admit(trust, user, asking("ha")).refusal is not None
    assert "none is configured" in (admit(trust, "alice", asking("ha")).refusal or "")


properties = st.dictionaries(
    st.one_of(st.text(max_size=20), st.sampled_from([KIND_PROPERTY, "x-understudy-broker", "x-understudy-epoch"])),
    st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=20),
              st.sampled_from(["ha", "admin", "client", "HA", "Admin", " ha", "ha\x00"])),
    max_size=6,
)


@given(trust=st.sampled_from(sorted(TRUSTS)), user=st.sampled_from(IDENTITIES), props=properties)
def test_whatever_the_properties_the_role_is_one_the_identity_has(trust: str, user: str | None,
                                                                  props: dict[Any, Any]) -> None:
    kinds, admin = ALLOWED[(trust, user)]
    a = admit(TRUSTS[trust], user, props)
    assert a.kind in kinds
    assert a.admin == admin  # the admin flag never depends on the properties
    if a.refusal is not None:
        assert a.kind == Kind.CLIENT and a.asked == "ha"  # only a claim to replicate is refused
    # Asking for nothing, or for `client`, never earns more than asking for anything else.
    plain = admit(TRUSTS[trust], user, {})
    assert (plain.kind, plain.admin, plain.refusal) == (Kind.CLIENT, admin, None)


@given(props=properties)
def test_asked_kind_is_text_whatever_the_value(props: dict[Any, Any]) -> None:
    value = props.get(KIND_PROPERTY, "client")
    assert admit(SECURED, "bob", props).asked == (value if isinstance(value, str) else repr(value)[:64])


@pytest.mark.parametrize(("subject", "name"), [("CN=client", "client"), ("CN=backup1,O=Example", "backup1"),
                                               ("O=Example, CN=b2", "b2"), ("/O=Example/CN=b3", "b3"),
                                               ("O=Example", "O=Example")])
def test_a_certificate_logs_in_as_its_cn(subject: str, name: str) -> None:
    assert certificate_name(subject) == name
