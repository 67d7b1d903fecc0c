"""The ingest tests' clock: one per module."""

from __future__ import annotations

import time

import pytest

from pipeline.ingest.validate import MAX_TS_MS, Limits


@pytest.fixture(autouse=True, scope="module")
def one_clock_per_module():
    """``Limits.max_ts`` reads a clock frozen when the module starts. The reason given for a
    too-new event names the latest time accepted, to the second, and these tests compare the
    reasons of two validations of one event (a reference and the path under test): with a live
    clock they differ whenever a second boundary falls between the two."""
    now = time.time()

    def max_ts(self) -> int:
        return min(MAX_TS_MS, int((now + self.future_seconds) * 1000))

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Limits, "max_ts", max_ts)
        yield
