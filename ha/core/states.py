"""HA states, roles and the transition table.

The table ``TRANSITIONS`` is the single source of truth: ``docs/states.md`` is generated from it and from the
controller's events (``python -m ha.core.controller > docs/states.md``). The broker does not pick target states: it reports what happened
(a ``Trigger``) and ``fire(state, trigger)`` looks the next state up (each (state, trigger) pair has at most one
entry, checked at import), refusing a trigger the table has no entry for. ``transition()`` checks an explicit
(from, to) pair against the same table.

Forced promotion: promoting a backup that is not ready (``joining``/``catchup`` -> ``recovering``) is in the table but
marked ``forced``; ``transition()`` refuses it unless the caller passes ``forced=True`` (``ha-admin promote --force``).
``forced=True`` is harmless on a normal transition (promoting a ready backup with ``--force`` just promotes it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from types import MappingProxyType


class Role(Enum):
    PRIMARY = "primary"
    BACKUP = "backup"
    STANDALONE = "standalone"


class HaState(Enum):
    STANDALONE = "standalone"
    JOINING = "joining"
    CATCHUP = "catchup"
    READY = "ready"
    RECOVERING = "recovering"
    ACTIVE = "active"

    @property
    def role(self) -> Role:
        return _ROLES[self]


_ROLES: Mapping[HaState, Role] = MappingProxyType(
    {
        HaState.STANDALONE: Role.STANDALONE,
        HaState.JOINING: Role.BACKUP,
        HaState.CATCHUP: Role.BACKUP,
        HaState.READY: Role.BACKUP,
        HaState.RECOVERING: Role.PRIMARY,
        HaState.ACTIVE: Role.PRIMARY,
    }
)


class Trigger(Enum):
    """What causes a transition; callers log it as (part of) the ``reason``."""

    PRIMARY_CONNECTED = "primary-connected"
    CAUGHT_UP = "caught-up"
    PRIMARY_LOST = "primary-lost"
    PROMOTE = "promote"
    FORCE_PROMOTE = "force-promote"
    RECOVERED = "recovered"
    DEMOTE = "demote"


@dataclass(frozen=True)
class Transition:
    trigger: Trigger
    description: str
    forced: bool = False


S = HaState
TRANSITIONS: Mapping[tuple[HaState, HaState], Transition] = MappingProxyType(
    {
        (S.JOINING, S.CATCHUP): Transition(
            Trigger.PRIMARY_CONNECTED,
            "connected to the primary (epoch accepted); catch-up of every queue begins",
        ),
        (S.CATCHUP, S.READY): Transition(
            Trigger.CAUGHT_UP,
            "every replicated queue caught up and every message sent before joining acknowledged",
        ),
        (S.CATCHUP, S.JOINING): Transition(
            Trigger.PRIMARY_LOST, "primary connection lost (or refused); reconnect with backoff"
        ),
        (S.READY, S.CATCHUP): Transition(
            Trigger.PRIMARY_CONNECTED,
            "reconnected to a primary: re-sync. A ready backup that loses its primary stays ready (it holds "
            "every acknowledged message), so it can be promoted",
        ),
        (S.READY, S.RECOVERING): Transition(
            Trigger.PROMOTE, "promoted (ha-admin promote, Pacemaker, ZooKeeper)"
        ),
        (S.JOINING, S.RECOVERING): Transition(
            Trigger.FORCE_PROMOTE,
            "forced promotion of a backup that is not ready (disaster recovery; acknowledged messages may be lost). "
            "Taken without --force only by a brand-new cluster's first primary and by the broker elected with the "
            "newest journal after a whole-cluster outage (docs/durability.md)",
            forced=True,
        ),
        (S.CATCHUP, S.RECOVERING): Transition(
            Trigger.FORCE_PROMOTE,
            "forced promotion of a backup that is not ready (disaster recovery; acknowledged messages may be lost)",
            forced=True,
        ),
        (S.RECOVERING, S.ACTIVE): Transition(
            Trigger.RECOVERED,
            "the backups that were ready before the failover caught up, or --ha-backup-timeout",
        ),
        (S.RECOVERING, S.JOINING): Transition(
            Trigger.DEMOTE, "demoted (ha-admin demote, lost lease, newer epoch seen); restart as a backup"
        ),
        (S.ACTIVE, S.JOINING): Transition(
            Trigger.DEMOTE, "demoted (ha-admin demote, lost lease, newer epoch seen); restart as a backup"
        ),
    }
)
del S

NEXT: Mapping[tuple[HaState, Trigger], tuple[HaState, Transition]] = MappingProxyType(
    {(frm, t.trigger): (to, t) for (frm, to), t in TRANSITIONS.items()})
if len(NEXT) != len(TRANSITIONS):  # pragma: no cover - a table error, caught by any import
    raise AssertionError("two transitions from one state on one trigger: the trigger must pick the transition")


class IllegalTransition(Exception):
    """A transition that is not in ``TRANSITIONS`` (or a forced one without ``forced=True``) was attempted.

    This is a local error (the caller asked for something the table forbids); an admin request that causes it should
    be answered with a refusal carrying ``str(error)``.
    """

    def __init__(
        self, from_state: HaState, to_state: HaState | None, reason: str, *, needs_force: bool = False,
        trigger: Trigger | None = None,
    ) -> None:
        self.from_state = from_state
        self.to_state = to_state
        self.reason = reason
        self.needs_force = needs_force
        detail = (
            "requires a forced promotion (--force; acknowledged messages may be lost)"
            if needs_force
            else "not in the transition table"
        )
        target = to_state.value if to_state is not None else f"? on {trigger.value if trigger else 'nothing'}"
        super().__init__(f"illegal HA state transition {from_state.value} -> {target} ({reason}): {detail}")

    def log_fields(self) -> dict[str, str]:
        """Fields of the ``ha.state.illegal`` event (docs/events.md)."""
        to = self.to_state.value if self.to_state is not None else "none"
        return {"from_state": self.from_state.value, "to_state": to, "reason": self.reason}


def fire(current: HaState, trigger: Trigger, reason: str, *, forced: bool = False) -> HaState:
    """The state ``trigger`` leads to from ``current`` (the table's entry), else ``IllegalTransition``. A forced
    entry (promotion of a backup that is not ready) needs ``forced=True``."""
    entry = NEXT.get((current, trigger))
    if entry is None:
        raise IllegalTransition(current, None, reason, trigger=trigger)
    to, t = entry
    if t.forced and not forced:
        raise IllegalTransition(current, to, reason, needs_force=True)
    return to


def transition(current: HaState, to: HaState, reason: str, *, forced: bool = False) -> HaState:
    """Return ``to`` if (current, to) is in the table, else raise ``IllegalTransition``.

    A forced entry (promotion of a backup that is not ready) needs ``forced=True``.
    """
    entry = TRANSITIONS.get((current, to))
    if entry is None:
        raise IllegalTransition(current, to, reason)
    if entry.forced and not forced:
        raise IllegalTransition(current, to, reason, needs_force=True)
    return to


def allowed_targets(current: HaState, *, forced: bool = False) -> list[HaState]:
    """States reachable from ``current`` in one step, in table order."""
    return [to for (frm, to), t in TRANSITIONS.items() if frm is current and (forced or not t.forced)]


def render_mermaid() -> str:
    """A mermaid ``stateDiagram-v2`` of the table (forced transitions drawn with a ``forced`` label)."""
    lines = ["stateDiagram-v2"]
    lines.append(f"    [*] --> {HaState.JOINING.value}: --ha-cluster")
    lines.append(f"    [*] --> {HaState.STANDALONE.value}: no --ha-cluster")
    for (frm, to), t in TRANSITIONS.items():
        label = t.trigger.value + (" (forced)" if t.forced else "")
        lines.append(f"    {frm.value} --> {to.value}: {label}")
    return "\n".join(lines) + "\n"


def render_markdown(extra: str = "") -> str:
    """The state table's part of docs/states.md (the whole page is `ha.core.controller.render_markdown`: this plus
    `extra`, the controller's events)."""
    out = [
        "# HA states",
        "",
        "<!-- Generated from ha/core/states.py and ha/core/controller.py by `python -m ha.core.controller > "
        "docs/states.md`; do not edit. -->",
        "",
        "Every broker is in exactly one state. A backup goes `joining` -> `catchup` -> `ready`; a promoted backup",
        "becomes a primary, `recovering` then `active`; a broker without `--ha-cluster` is `standalone` and never",
        "changes state. Any transition not in the table below is refused and logged as `ha.state.illegal`; every",
        "accepted one is logged as `ha.state` (docs/events.md).",
        "",
        "```mermaid",
        render_mermaid().rstrip("\n"),
        "```",
        "",
        "## States",
        "",
        "| state | role |",
        "|-------|------|",
    ]
    out += [f"| `{s.value}` | {s.role.value} |" for s in HaState]
    out += [
        "",
        "## Transitions",
        "",
        "| from | to | trigger | forced | when |",
        "|------|----|---------|--------|------|",
    ]
    for (frm, to), t in TRANSITIONS.items():
        forced = "yes" if t.forced else ""
        out.append(f"| `{frm.value}` | `{to.value}` | `{t.trigger.value}` | {forced} | {t.description} |")
    out += [
        "",
        "A *forced* transition happens only when the operator asks for it (`ha-admin promote --force`): promoting a",
        "backup that has not caught up may lose messages that clients saw acknowledged. Without `--force`, promotion",
        "from `joining` or `catchup` is refused with an error naming both states.",
        "",
    ]
    return "\n".join(out) + extra
