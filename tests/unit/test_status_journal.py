"""ha-status shows a member whose journal cannot write (disk full, I/O error), or whose disk is under
--min-disk-free (or, on a primary, a backup's is), in its row's note."""

from __future__ import annotations

from typing import Any

from rich.console import Console

from ha.status_cli import render


def row(name: str, role: str, state: str, journal_failed: str | None) -> dict[str, Any]:
    return {"name": name, "address": f"{name}:5672", "role": role, "state": state, "epoch": 3, "position": 10,
            "queues": 1, "backlog": None, "lag_ms": None, "primary": "b1", "source": "self", "as_of": 0.0,
            "journal_failed": journal_failed}


def shown(view: dict[str, Any]) -> str:
    console = Console(record=True, width=200)
    console.print(render(view))
    return console.export_text()


def test_a_member_whose_journal_cannot_write_says_so_in_its_row() -> None:
    view = {"brokers_url": "b1:5672,b2:5672", "public_url": None, "epoch": 3, "primaries": ["b1"],
            "members": [row("b1", "primary", "active", "journal: disk full (No space left on device)"),
                        row("b2", "backup", "joining", None)]}
    text = shown(view)
    b1 = next(line for line in text.splitlines() if line.lstrip("│ ").startswith("b1"))
    assert "JOURNAL CANNOT WRITE: journal: disk full" in b1


def test_no_note_column_while_every_journal_writes() -> None:
    view = {"brokers_url": "b1:5672", "public_url": None, "epoch": 3, "primaries": ["b1"],
            "members": [row("b1", "primary", "active", None)]}
    assert "Note" not in shown(view)


def test_a_member_under_min_disk_free_says_so_in_its_row() -> None:
    low = row("b1", "primary", "active", None)
    low["journal_low_disk"] = ("the journal's disk has 3.0 MiB free, under --min-disk-free 4.0 MiB: durable "
                               "messages are refused until there is room")
    view = {"brokers_url": "b1:5672,b2:5672", "public_url": None, "epoch": 3, "primaries": ["b1"],
            "members": [low, row("b2", "backup", "ready", None)]}
    b1 = next(line for line in shown(view).splitlines() if line.lstrip("│ ").startswith("b1"))
    assert "DISK LOW: the journal's disk has 3.0 MiB free" in b1


def test_a_primary_held_back_by_a_backups_low_disk_says_so_in_its_row() -> None:
    primary = row("b1", "primary", "active", None)
    primary["backups_low_disk"] = ["b2"]
    backup = row("b2", "backup", "ready", None)
    backup["journal_low_disk"] = "the journal's disk has 3.0 MiB free, under --min-disk-free 4.0 MiB: ..."
    text = shown({"brokers_url": "b1:5672,b2:5672", "public_url": None, "epoch": 3, "primaries": ["b1"],
                  "members": [primary, backup]})
    b1 = next(line for line in text.splitlines() if line.lstrip("│ ").startswith("b1"))
    b2 = next(line for line in text.splitlines() if line.lstrip("│ ").startswith("b2"))
    assert "DURABLE REFUSED: disk low on backup b2" in b1 and "DISK LOW: the journal's disk has 3.0 MiB" in b2
