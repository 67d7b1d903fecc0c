"""What a retrain is doing, for a person at a terminal: one status line on stderr naming the
phase (dataset, tuning, fit, each challenger, blends, gate, publish, report), the settings a
search has scored out of its count, and the run's seconds so far.

The steps say where they are with :func:`phase` and :func:`step`; without a line on show
(``rankstream train --no-progress``, a run whose stderr is no terminal, Airflow, tests) both
do nothing. The line belongs to the thread that shows it (a context variable): worker threads
of a run never draw.

>>> import io
>>> out = io.StringIO()
>>> with showing(True, "train movies", stream=out, clock=iter(range(100)).__next__):
...     phase("tuning AltSVM")
...     step(2, 6)
>>> out.getvalue().split("\\r")[-2]
'train movies: tuning AltSVM 2/6  [3 s]\\x1b[K'
"""

from __future__ import annotations

import contextvars
import sys
import time
from contextlib import contextmanager

_SHOWN: contextvars.ContextVar = contextvars.ContextVar("rankstream_progress", default=None)


class StatusLine:
    """The status line of one run (see the module)."""

    def __init__(self, label: str, stream, clock):
        self.label, self.stream, self.clock = label, stream, clock
        self.started = clock()
        self.name, self.count = "starting", None

    def enter(self, name: str) -> None:
        self.name, self.count = name, None
        self.draw()

    def step(self, done: int, total: int) -> None:
        self.count = (done, total)
        self.draw()

    def draw(self) -> None:
        count = "" if self.count is None else f" {self.count[0]}/{self.count[1]}"
        seconds = self.clock() - self.started
        self.stream.write(f"\r{self.label}: {self.name}{count}  [{seconds:.0f} s]\x1b[K")
        self.stream.flush()

    def close(self) -> None:
        self.stream.write("\r\x1b[K")
        self.stream.flush()


@contextmanager
def showing(enabled: bool, label: str, *, stream=None, clock=time.monotonic):
    """Show the run's status line on ``stream`` (stderr) while the block runs, if
    ``enabled``; it is cleared at the end, so the summary prints on a clean line."""
    if not enabled:
        yield None
        return
    line = StatusLine(label, stream or sys.stderr, clock)
    token = _SHOWN.set(line)
    try:
        line.draw()
        yield line
    finally:
        _SHOWN.reset(token)
        line.close()


def phase(name: str) -> None:
    """The run entered ``name`` (nothing without a status line on show)."""
    line = _SHOWN.get()
    if line is not None:
        line.enter(name)


def step(done: int, total: int) -> None:
    """The current phase has done ``done`` of ``total`` (settings scored, ...)."""
    line = _SHOWN.get()
    if line is not None:
        line.step(done, total)
