"""``pipeline.heap.release_freed_memory``: freed pages between live objects go back to the OS
(a refresher's batches leave them behind)."""

from __future__ import annotations

import platform
import subprocess
import sys
from pathlib import Path

import pytest

PROBE = """
from pipeline.heap import release_freed_memory

def rss():
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * 4096

blocks, pins = [], []
for n in range(3000):            # 100 kB blocks (under glibc's mmap threshold: on the heap)
    blocks.append(b"x" * 100_000)
    pins.append(b"p" * 600)      # a small live object after each: the heap's top stays up
held = rss()
del blocks
freed = rss()
release_freed_memory()
print(held, freed, rss())
"""


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
                    reason="malloc_trim is glibc's; elsewhere release_freed_memory does nothing")
def test_freed_pages_between_live_objects_go_back_to_the_os():
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                         check=True, timeout=60,
                         cwd=Path(__file__).resolve().parents[1]).stdout
    held, freed, trimmed = map(int, out.split())
    assert held > 250 << 20
    assert freed > 100 << 20, "glibc kept the freed blocks: the case this is for"
    assert trimmed < freed / 3, (held, freed, trimmed)
