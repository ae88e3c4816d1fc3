"""The report's aggregated results as plain Python values (what the HTML, CSV and text summary are made from)."""

from __future__ import annotations

import datetime as dt
from collections import Counter
from dataclasses import dataclass
from typing import Any

from spark.events import BAD_QUALITIES, Quality

Row = dict[str, Any]


@dataclass(frozen=True)
class Table:
    name: str
    columns: tuple[str, ...]
    rows: tuple[Row, ...]

    def __len__(self) -> int:
        return len(self.rows)


@dataclass(frozen=True)
class ReportData:
    dates: str
    inputs: tuple[str, ...]
    percentile_method: str
    lag: Table
    catchups: Table
    failovers: Table
    backups_ready: Table
    states: Table
    quality: Table
    bad_files: Table
    generated_at: dt.datetime

    def tables(self) -> tuple[Table, ...]:
        return (self.lag, self.catchups, self.failovers, self.backups_ready, self.states, self.quality,
                self.bad_files)

    def lines_by_quality(self) -> Counter[str]:
        counts: Counter[str] = Counter()
        for row in self.quality.rows:
            counts[row["quality"]] += row["lines"]
        return counts

    def bad_counts(self) -> dict[str, int]:
        """Every bad-input category with its count (zeros included, so readers see what was checked)."""
        counts = self.lines_by_quality()
        return {q.value: counts.get(q.value, 0) for q in BAD_QUALITIES}

    @property
    def ok_events(self) -> int:
        return self.lines_by_quality().get(Quality.OK.value, 0)

    @property
    def lines_read(self) -> int:
        return sum(self.lines_by_quality().values())

    def unknown_event_names(self) -> list[str]:
        return sorted(r["event"] for r in self.quality.rows if r["quality"] == Quality.UNKNOWN_EVENT.value)
