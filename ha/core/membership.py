"""The member list the primary maintains and sends to every backup (``ha.membership`` events, ``ha-admin query``).

Values are immutable; members are kept sorted by name so every broker holds (and logs) an identical list.
The wire form is a plain map, ready to be an AMQP map body::

    {"epoch": 3, "seq": 7,
     "members": [{"name": "b1", "address": "127.0.0.1:5672", "role": "primary", "state": "active"}]}

``seq`` numbers the lists one primary sends in its epoch (1, 2, ...): every broker journals the newest list it knows
(`ha.core.restart.ReadyView`), and after a whole-cluster outage the list with the highest (epoch, seq) says who held
every confirmed message. A primary of an older release sends none (0).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from ha.core.states import HaState, Role

_FIELDS = ("name", "address", "role", "state")


@dataclass(frozen=True)
class Member:
    name: str
    address: str  # host:port of the broker itself (from --ha-brokers-url), never the VIP
    role: Role
    state: HaState

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("member name must not be empty")
        if self.role is not self.state.role:
            raise ValueError(
                f"member {self.name!r}: role {self.role.value} does not match state {self.state.value} "
                f"(a {self.state.value} broker is {self.state.role.value})"
            )

    @classmethod
    def of(cls, name: str, address: str, state: HaState) -> Member:
        """A member whose role follows from its state."""
        return cls(name, address, state.role, state)

    def to_wire(self) -> dict[str, str]:
        return {
            "name": self.name,
            "address": self.address,
            "role": self.role.value,
            "state": self.state.value,
        }

    @classmethod
    def from_wire(cls, data: object) -> Member:
        if not isinstance(data, Mapping):
            raise ValueError(f"member must be a map, got {type(data).__name__}")
        missing = [f for f in _FIELDS if f not in data]
        if missing:
            raise ValueError(f"member {data!r} lacks {', '.join(missing)}")
        values = {f: data[f] for f in _FIELDS}
        bad = [f for f, v in values.items() if not isinstance(v, str)]
        if bad:
            raise ValueError(f"member {data!r}: {', '.join(bad)} must be strings")
        try:
            role, state = Role(values["role"]), HaState(values["state"])
        except ValueError as e:
            raise ValueError(f"member {data!r}: {e}") from None
        return cls(values["name"], values["address"], role, state)


@dataclass(frozen=True)
class Membership:
    epoch: int
    members: tuple[Member, ...] = ()
    seq: int = 0  # which list of its epoch this is (the primary counts from 1); 0: not numbered

    def __post_init__(self) -> None:
        for label, value in (("epoch", self.epoch), ("seq", self.seq)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{label} must be an int >= 0, got {value!r}")
        names = [m.name for m in self.members]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate member names: {sorted(names)}")
        ordered = tuple(sorted(self.members, key=lambda m: m.name))
        if ordered != self.members:
            object.__setattr__(self, "members", ordered)

    def with_member(self, member: Member) -> Membership:
        """Add ``member``, or replace the member of the same name."""
        return replace(self, members=(*(m for m in self.members if m.name != member.name), member))

    def without(self, name: str) -> Membership:
        """Remove the member called ``name`` (no change if absent)."""
        return replace(self, members=tuple(m for m in self.members if m.name != name))

    def with_epoch(self, epoch: int) -> Membership:
        return replace(self, epoch=epoch)

    def same_list(self, other: Membership) -> bool:
        """The same epoch and members, whatever the numbering."""
        return self.epoch == other.epoch and self.members == other.members

    def get(self, name: str) -> Member | None:
        return next((m for m in self.members if m.name == name), None)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(m.name for m in self.members)

    @property
    def primary(self) -> Member | None:
        """The member in a primary state, if exactly one is."""
        primaries = [m for m in self.members if m.role is Role.PRIMARY]
        return primaries[0] if len(primaries) == 1 else None

    @property
    def ready_names(self) -> tuple[str, ...]:
        """Backups in state ready."""
        return tuple(m.name for m in self.members if m.state is HaState.READY)

    def to_wire(self) -> dict[str, object]:
        return {"epoch": self.epoch, "seq": self.seq, "members": [m.to_wire() for m in self.members]}

    @classmethod
    def from_wire(cls, data: object) -> Membership:
        """Parse the wire map; raises ValueError naming what is wrong."""
        if not isinstance(data, Mapping):
            raise ValueError(f"membership must be a map, got {type(data).__name__}")
        epoch = data.get("epoch")
        if isinstance(epoch, bool) or not isinstance(epoch, int):
            raise ValueError(f"membership epoch must be an int, got {epoch!r}")
        seq = data.get("seq", 0) or 0  # none from a primary of an older release
        if isinstance(seq, bool) or not isinstance(seq, int):
            raise ValueError(f"membership seq must be an int, got {seq!r}")
        members = data.get("members")
        if not isinstance(members, list | tuple):
            raise ValueError(f"membership members must be a list, got {type(members).__name__}")
        return cls(epoch, tuple(Member.from_wire(m) for m in members), seq)

    def event_members(self) -> list[dict[str, str]]:
        """The ``members`` field of the ``ha.membership`` event (docs/events.md)."""
        return [{"name": m.name, "address": m.address, "state": m.state.value} for m in self.members]
