"""Readers in other threads and processes hammer lookups while 50 publishes and rollbacks
happen: every answer must match exactly one published version, batches never mix versions,
and no answer ever comes from a missing key."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import numpy as np

from pipeline.serving.lookup import TopK
from pipeline.serving.publish import publish
from pipeline.serving.versions import rollback
from tests.conftest import REPO
from tests.serving._readers import hammer
from tests.serving.helpers import reference_user, user_model


def test_readers_never_see_a_mix_of_versions(redis_url, redis_client, tmp_path):
    n_users = 30
    model = "atomic"
    published: dict[int, object] = {}
    first = user_model(0, n_users=n_users, n_items=50, rank=4)
    published[publish(model, first, redis_client, top_k=5, keep_versions=2).version] = first
    users = first.key_ids.tolist()

    work = tmp_path / "readers"
    work.mkdir()
    procs = [subprocess.Popen([sys.executable, "-m", "tests.serving._readers", redis_url, model,
                               json.dumps(users), str(work)], cwd=REPO) for _ in range(2)]
    stop_t = threading.Event()
    thread_results: list = []
    shared = TopK(redis_url, timeout=5.0)  # two threads share one client, a third has its own
    threads = [threading.Thread(target=lambda s=s: thread_results.append(
        hammer(redis_url, model, users, stop_t, shared=s))) for s in (shared, shared, None)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 120
    while len(list(work.glob("ready.*"))) < len(procs):
        assert time.monotonic() < deadline, "reader processes did not start"
        assert all(p.poll() is None for p in procs), "a reader process died"
        time.sleep(0.05)

    rng = np.random.default_rng(1)
    rollbacks = 0
    for seed in range(1, 51):
        art = user_model(seed, n_users=n_users, n_items=50, rank=4)
        res = publish(model, art, redis_client, top_k=5, keep_versions=2)
        published[res.version] = art
        if rng.random() < 0.4:  # back to the previous version, then forward again
            assert rollback(model, redis_client) == res.version - 1
            assert rollback(model, redis_client, version=res.version) == res.version
            rollbacks += 2
    stop_t.set()
    (work / "stop").touch()
    for t in threads:
        t.join(60)
    shared.close()
    for p in procs:
        assert p.wait(120) == 0
    results = list(thread_results)
    for f in sorted(work.glob("result.*.json")):
        data = json.loads(f.read_text())
        results.append((data["n"], {(v, u, s, tuple(i), tuple(sc))
                                    for v, u, s, i, sc in data["seen"]}, data["errors"]))
    assert len(results) == len(threads) + len(procs)

    assert rollbacks > 10
    row_of = {u: i for i, u in enumerate(users)}
    total = 0
    versions_seen = set()
    for n, seen, errors in results:
        assert errors == [], errors[:5]
        assert n > 50, "a reader hardly ran"
        total += n
        for version, user, source, ids, scores in seen:
            assert source == "precomputed", (version, user, source)
            expected = reference_user(published[version], row_of[user], 5)
            assert list(ids) == [i for i, _ in expected], (version, user)
            assert np.allclose(scores, [s for _, s in expected], rtol=1e-5)
            versions_seen.add(version)
    # the readers really did run across many versions
    assert len(versions_seen) >= 10, sorted(versions_seen)
    print(f"\n{total} lookups over {len(versions_seen)} versions by {len(results)} readers")
    assert total > 1000
