"""Every bench script answers ``--help`` with its usage, not a traceback (an argparse help
string with a bare ``%`` crashed ``bench/scale.py --help``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
SCRIPTS = sorted(p.name for p in BENCH.glob("*.py")        # the runnable ones (not an app
                  if '__name__ == "__main__"' in p.read_text())   # a server imports)


@pytest.mark.parametrize("script", SCRIPTS)
def test_bench_script_prints_its_usage(script):
    done = subprocess.run([sys.executable, str(BENCH / script), "--help"], capture_output=True,
                          text=True, timeout=120, cwd=BENCH.parent)
    assert done.returncode == 0, done.stderr[-500:]
    assert "usage:" in done.stdout and "Traceback" not in done.stderr
