"""Batch work at a lowered CPU priority (pipeline.serving.background)."""

import os
import sys
import threading

import pytest

from pipeline.serving.background import BATCH_NICENESS, run_at_niceness

linux = pytest.mark.skipif(not sys.platform.startswith("linux"),
                           reason="per-thread niceness is Linux's")


def _own_niceness() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


@linux
def test_the_call_runs_at_the_niceness_and_the_caller_keeps_its_own():
    before = _own_niceness()
    inside = run_at_niceness(_own_niceness)
    assert inside == max(before, BATCH_NICENESS)
    assert _own_niceness() == before


@linux
def test_threads_the_call_starts_inherit_its_niceness():
    def spawn():
        seen = []
        t = threading.Thread(target=lambda: seen.append(_own_niceness()))
        t.start()
        t.join()
        return seen[0]

    assert run_at_niceness(spawn, niceness=BATCH_NICENESS) >= BATCH_NICENESS


def test_the_value_and_the_error_come_back_to_the_caller():
    assert run_at_niceness(divmod, 7, 2) == (3, 1)
    with pytest.raises(ZeroDivisionError):
        run_at_niceness(divmod, 1, 0)


def test_none_runs_the_call_in_the_callers_thread():
    assert run_at_niceness(threading.get_ident, niceness=None) == threading.get_ident()


@linux
def test_a_publish_runs_at_batch_niceness(monkeypatch):
    from pipeline.serving import publish as publisher
    from pipeline.serving.artifact import ModelArtifact
    from pipeline.serving.embedded_redis import EmbeddedRedis

    seen = []
    draft = publisher._draft
    monkeypatch.setattr(publisher, "_draft",
                        lambda *a: seen.append(_own_niceness()) or draft(*a))
    art = ModelArtifact.global_list(item_ids=["a", "b"], scores=[0.1, 0.2])
    with EmbeddedRedis() as server:
        publisher.publish("top", art, server.url, top_k=2)
        publisher.publish("top", art, server.url, top_k=2, niceness=None)
    assert seen == [max(_own_niceness(), BATCH_NICENESS), _own_niceness()]
