"""What one ingestion run did (:class:`IngestSummary`: counts, and what was odd in its files),
and the progress bar ingestion and the producer draw on a terminal."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pipeline.ingest.buffer import Flushed


@dataclass
class IngestSummary:
    """Counts of one ingestion run; ``str()`` is a readable summary."""

    messages: int = 0
    events: Counter = field(default_factory=Counter)
    dead_letters: Counter = field(default_factory=Counter)
    segments: int = 0
    flushes: int = 0
    seconds: float = 0.0
    stopped: str = ""
    unit: str = "messages"
    recreated: list = field(default_factory=list)   # "topic/partition -> its new generation"
    already_stored: int = 0                          # file records the store held already
    removed: list = field(default_factory=list)      # "path: n" records gone from a file
    warnings: list = field(default_factory=list)     # what a file held that was odd

    def add(self, flushed: Flushed) -> None:
        self.events.update(flushed.events)
        self.dead_letters.update(flushed.dead_letters)
        self.segments += flushed.files
        self.flushes += 1

    def __str__(self) -> str:
        events = sum(self.events.values())
        rate = events / self.seconds if self.seconds > 0 else 0.0
        by_kind = ", ".join(f"{k} {n:,}" for k, n in sorted(self.events.items())) or "none"
        dead = ", ".join(f"{k} {n:,}" for k, n in sorted(self.dead_letters.items()))
        return (f"ingested {events:,} events ({by_kind}) from {self.messages:,} {self.unit} in "
                f"{self.seconds:.1f} s ({rate:,.0f} events/s); "
                f"dead letters: {sum(self.dead_letters.values()):,}"
                + (f" ({dead})" if dead else "")
                + f"; {self.segments} segment files in {self.flushes} flushes"
                + (f"; stopped: {self.stopped}" if self.stopped else "")
                + (f"; RE-CREATED TOPICS, stored as new generations: "
                   f"{', '.join(self.recreated)}" if self.recreated else "")
                + (f"; {self.already_stored:,} {self.unit} already stored"
                   if self.already_stored else "")
                + (f"; RECORDS REMOVED OR CHANGED IN FILES since their last ingestion (what "
                   f"was stored stays; a changed event is stored again and wins): "
                   f"{', '.join(self.removed)}" if self.removed else "")
                + "".join(f"\nWARNING {said}" for said in self.warnings))


def progress_bar(enabled: bool, total=None, unit="msg", **kwargs):
    """A tqdm bar for long work: drawn only when ``enabled`` and stderr is a terminal (a bar
    written to a log file or a pipe is noise)."""
    from tqdm import tqdm

    return tqdm(total=total, unit=unit, disable=None if enabled else True, dynamic_ncols=True,
                leave=False, **kwargs)
