"""Publishing and lookups on a real 6-node Redis Cluster (3 primaries, 3 replicas, started by
``infra/redis/cluster-start.sh``): one model's keys spread over every primary, answers equal a
numpy reference, flips under concurrent readers never mix versions, and a primary killed
mid-read is failed over while lookups follow the configured policy."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from pipeline.cli import main
from pipeline.serving.artifact import ModelArtifact
from pipeline.serving.layout import BUCKETS, ModelKeys, bucket_of
from pipeline.serving.lookup import RedisUnavailable, TopK
from pipeline.serving.publish import publish
from pipeline.serving.redis_client import client_from_url, is_cluster
from pipeline.serving.versions import rollback, versions
from tests.serving._readers import hammer
from tests.serving.helpers import (
    reference_fallback,
    reference_global,
    reference_user,
    same_answer,
    user_model,
)


@pytest.fixture(scope="module")
def cluster(redis_cluster_url):
    client = client_from_url(redis_cluster_url, retries=3)
    yield client
    client.close()


@pytest.fixture(autouse=True)
def _fresh_namespaces(request):
    """Delete the keys the cluster tests write (their namespaces), as a session's cluster or
    one named by RANKSTREAM_REDIS_CLUSTER_URL may hold them from an earlier test or run."""
    if "cluster" not in request.fixturenames:
        return
    client = request.getfixturevalue("cluster")
    for namespace in ("cl-spread", "cl-prune", "rankstream"):
        for key in client.scan_iter(match="{" + namespace + ":*", count=1000):
            client.unlink(key)


def _primaries(client) -> dict[str, int]:
    """{primary node name: keys it holds (DBSIZE)}."""
    return {node.name: client.get_redis_connection(node).dbsize()
            for node in client.get_primaries()}


def test_a_models_keys_land_on_every_primary_and_lookups_match_numpy(redis_cluster_url,
                                                                     cluster):
    assert is_cluster(cluster) and len(cluster.get_primaries()) == 3
    assert is_cluster(client_from_url(redis_cluster_url.split("/0")[0] + "/0?cluster=1"))
    mask = np.arange(300) % 5 > 0                   # a fifth of the users scored on demand
    art = user_model(0, n_users=300, n_items=60, str_ids=True, precompute=mask)
    res = publish("spread", art, cluster, top_k=12, namespace="cl-spread")
    keys = ModelKeys("cl-spread", "spread")
    vk = keys.version(res.version)

    # where every per-user key lives: the server's CLUSTER KEYSLOT, the owner of that slot, and
    # the key really is on that primary
    owner = {}
    for (start, end), nodes in cluster.cluster_slots().items():   # CLUSTER SLOTS, parsed
        host, port = nodes["primary"]
        owner.update({s: f"{host}:{port}" for s in range(start, end + 1)})
    holds: dict[str, int] = {}
    for row, user in enumerate(art.key_ids.tolist()):
        key = vk.topk(user) if mask[row] else vk.user_factor(user)
        slot = cluster.execute_command("CLUSTER KEYSLOT", key)
        assert slot == cluster.keyslot(keys.pointer(bucket_of(user)))  # the bucket's slot
        node = cluster.get_node(node_name=owner[slot])
        assert cluster.get_redis_connection(node).exists(key) == 1, key
        holds[owner[slot]] = holds.get(owner[slot], 0) + 1
    assert set(holds) == {n.name for n in cluster.get_primaries()}, holds
    assert min(holds.values()) > 300 / 3 * 0.6, holds       # spread, not just touching
    assert all(n > BUCKETS / 3 * 0.8 for n in _primaries(cluster).values())  # pointers too

    with TopK(redis_cluster_url, namespace="cl-spread", timeout=2.0) as topk:
        for row, user in enumerate(art.key_ids.tolist()):
            rec = topk.recommend("spread", user, k=12)
            assert rec.source == ("precomputed" if mask[row] else "on_demand"), user
            assert same_answer(rec.items, reference_user(art, row, 12)), user
            if row % 25 == 0:
                longer = topk.recommend("spread", user, k=30)
                assert longer.source == "on_demand"
                assert same_answer(longer.items, reference_user(art, row, 30))
        rng = np.random.default_rng(0)
        for _ in range(20):
            rows = rng.choice(art.n_keys, 64, replace=False)
            batch = topk.recommend_many("spread", [art.key_ids[r] for r in rows] + ["nobody"],
                                        k=8)
            assert len({r.version for r in batch}) == 1
            for r, rec in zip(rows, batch):
                assert same_answer(rec.items, reference_user(art, r, 8))
            assert batch[-1].source == "fallback"
            assert same_answer(batch[-1].items, reference_fallback(art, 8))

        ids, scores = np.arange(40) * 3, rng.standard_normal(40)
        publish("top", ModelArtifact.global_list(item_ids=ids, scores=scores), cluster,
                top_k=10, namespace="cl-spread")
        assert same_answer(topk.recommend("top", k=10).items, reference_global(ids, scores, 10))
        docs = ModelArtifact.query_docs(query_ids=["q1", "q2"], doc_ids=["d0", "d1", "d2"],
                                        indptr=[0, 2, 3], docs=[0, 2, 1], scores=[0.5, 2.0, 1.0])
        publish("search", docs, cluster, top_k=2, namespace="cl-spread")
        assert topk.recommend("search", "q1").items == [("d2", 2.0), ("d0", 0.5)]


def test_prune_and_rollback_on_the_cluster(redis_cluster_url, cluster, capsys):
    arts = {}
    for seed in range(4):
        art = user_model(seed, n_users=80, n_items=30)
        arts[publish("m", art, cluster, top_k=5, keep_versions=2,
                     namespace="cl-prune").version] = art
    assert [v.version for v in versions("m", cluster, namespace="cl-prune")] == [3, 4]
    left = {k.decode().split("}:")[1].split(":")[0]
            for k in cluster.scan_iter(match="{cl-prune:m*}:v[0-9]*", count=1000)}
    assert left == {"v3", "v4"}          # every node scanned: versions 1 and 2 are gone
    with TopK(redis_cluster_url, namespace="cl-prune", timeout=2.0) as topk:
        assert rollback("m", cluster, namespace="cl-prune") == 3
        batch = topk.recommend_many("m", arts[3].key_ids.tolist(), k=5)
        assert {r.version for r in batch} == {3}
        assert all(same_answer(r.items, reference_user(arts[3], i, 5))
                   for i, r in enumerate(batch))
    common = ["--redis-url", redis_cluster_url, "--namespace", "cl-prune"]
    assert main(["recommend", "m", "1", "-k", "3", "--json", *common]) == 0
    assert '"version": 3' in capsys.readouterr().out


def test_flips_under_concurrent_readers_never_mix_versions(redis_cluster_url, cluster):
    model, n_users = "flips", 40
    published = {}
    first = user_model(0, n_users=n_users, n_items=40, rank=4)
    published[publish(model, first, cluster, top_k=5, keep_versions=2,
                      namespace="rankstream").version] = first
    users = first.key_ids.tolist()
    assert len({bucket_of(str(u)) for u in users}) > 30
    stop = threading.Event()
    results: list = []
    shared = TopK(redis_cluster_url, timeout=5.0)   # two threads share a client, one has its own
    threads = [threading.Thread(target=lambda s=s: results.append(
        hammer(redis_cluster_url, model, users, stop, shared=s))) for s in (shared, shared, None)]
    for t in threads:
        t.start()
    time.sleep(0.5)
    flips = 0
    seed = 1
    while flips < 20:
        art = user_model(seed, n_users=n_users, n_items=40, rank=4)
        version = publish(model, art, cluster, top_k=5, keep_versions=2).version
        published[version] = art
        flips += 1
        if seed % 2 == 0 and flips < 20:   # back to the previous version and forward again
            assert rollback(model, cluster) == version - 1
            assert rollback(model, cluster, version=version) == version
            flips += 2
        seed += 1
        time.sleep(0.05)
    time.sleep(0.3)
    stop.set()
    for t in threads:
        t.join(60)
    shared.close()
    assert len(results) == 3
    row_of = {u: i for i, u in enumerate(users)}
    total, versions_seen, mixed = 0, set(), 0
    for n, seen, errors in results:
        assert errors == [], errors[:5]
        assert n > 50, "a reader hardly ran"
        total += n
        for version, user, source, ids, scores in seen:
            assert source == "precomputed", (version, user, source)
            expected = reference_user(published[version], row_of[user], 5)
            # the answer is exactly its version's list, and no other version's
            matches = [v for v, art in published.items()
                       if [i for i, _ in reference_user(art, row_of[user], 5)] == list(ids)
                       and np.allclose(scores, [s for _, s in reference_user(
                           art, row_of[user], 5)], rtol=1e-5)]
            mixed += matches != [version]
            assert list(ids) == [i for i, _ in expected], (version, user)
            versions_seen.add(version)
    assert mixed == 0
    assert len(versions_seen) >= 5, sorted(versions_seen)
    print(f"\n{flips} flips, {total} lookups over {len(versions_seen)} versions by "
          f"{len(results)} reader threads, 0 answers mixing versions")


def _loop(topk: TopK, users: list, stop: threading.Event, log: list) -> None:
    """Look users up until ``stop``; log (time, 'ok' | 'stale' | 'error', answer or error)."""
    i = 0
    while not stop.is_set():
        user = users[i % len(users)]
        i += 1
        try:
            rec = topk.recommend("failover", user, k=5)
            log.append((time.monotonic(), "stale" if rec.stale else "ok", user, rec.items))
        except RedisUnavailable as err:
            log.append((time.monotonic(), "error", user, str(err)))
        time.sleep(0.002)


def _role_of(client, port: int) -> str:
    import redis

    try:
        return redis.Redis(port=port, socket_timeout=0.5).execute_command("ROLE")[0].decode()
    except redis.RedisError:
        return "down"


def test_a_primary_killed_mid_read_fails_over_and_lookups_recover(own_cluster):
    import redis

    client = client_from_url(own_cluster.url, retries=3)
    art = user_model(7, n_users=200, n_items=40)
    publish("failover", art, client, top_k=5)
    model_node = client.get_node_from_key(ModelKeys("rankstream", "failover").current)
    victims = [n for n in client.get_primaries() if n.name != model_node.name]
    victim = victims[0]
    # the users whose bucket lives on the victim, and its replica
    users = [u for u in art.key_ids.tolist()
             if client.get_node_from_key(ModelKeys("rankstream", "failover")
                                         .pointer(bucket_of(str(u)))).name == victim.name]
    assert len(users) > 20
    replica_port = next(p for p in own_cluster.ports
                        if _role_of(client, p) == "slave"
                        and redis.Redis(port=p).info("replication")["master_port"] == victim.port)
    strict = TopK(own_cluster.url, on_error="raise", timeout=0.3, retry_interval=0.1)
    lenient = TopK(own_cluster.url, on_error="last_known", timeout=0.3, retry_interval=0.1)
    row_of = {u: i for i, u in enumerate(art.key_ids.tolist())}
    before = {u: lenient.recommend("failover", u, k=5).items for u in users}
    for u in users:
        assert same_answer(before[u], reference_user(art, row_of[u], 5))
        assert strict.recommend("failover", u, k=5).items == before[u]

    stop = threading.Event()
    logs = {"raise": [], "last_known": []}
    threads = [threading.Thread(target=_loop, args=(t, users, stop, logs[name]))
               for name, t in (("raise", strict), ("last_known", lenient))]
    for t in threads:
        t.start()
    time.sleep(0.3)                       # reading steadily, then the primary dies
    killed_at = time.monotonic()
    own_cluster.kill(victim.port)
    promoted_at = None
    deadline = killed_at + 60
    while time.monotonic() < deadline:
        if promoted_at is None and _role_of(client, replica_port) == "master":
            promoted_at = time.monotonic()
        recovered = all(_last_bad(log) > killed_at and log[-1][1] == "ok"
                        for log in map(list, logs.values()))
        if promoted_at is not None and recovered:
            time.sleep(0.3)              # a little more reading after the recovery
            break
        time.sleep(0.05)
    stop.set()
    for t in threads:
        t.join(30)
    strict.close()
    lenient.close()
    assert promoted_at is not None, f"replica {replica_port} was not promoted within 60 s"

    for name, log in logs.items():
        after = [e for e in log if e[0] > killed_at]
        bad = [e for e in after if e[1] != "ok"]
        assert bad, f"{name}: no failed lookup at all after the kill"
        expected_bad = "error" if name == "raise" else "stale"
        assert {e[1] for e in bad} == {expected_bad}, (name, {e[1] for e in bad})
        if name == "last_known":           # stale answers are the last known ones
            assert all(e[3] == before[e[2]] for e in bad)
        else:
            assert all("unavailable" in e[3] for e in bad)
        fresh = [e for e in after if e[0] > bad[-1][0]]
        assert fresh and all(e[1] == "ok" for e in fresh), name
        for _, _, user, items in fresh:   # recovered answers are right again
            assert same_answer(items, reference_user(art, row_of[user], 5))
        first_fresh = fresh[0][0]
        print(f"\n{name}: {len(bad)} {expected_bad} answers, lookups answered again "
              f"{first_fresh - killed_at:.2f} s after the kill")
    print(f"failover: replica {replica_port} promoted {promoted_at - killed_at:.2f} s after "
          f"primary {victim.port} was killed (cluster-node-timeout 1000 ms)")
    client.close()


def _last_bad(log: list) -> float:
    bad = [t for t, kind, *_ in log if kind != "ok"]
    return bad[-1] if bad else 0.0


def test_cluster_stop_leaves_a_foreign_process_of_a_stale_pid_file_alone(tmp_path):
    import os
    import signal
    import subprocess

    from tests.servers import INFRA

    foreign = subprocess.Popen(["sleep", "60"])
    try:
        state = tmp_path / "cluster"
        for port in range(1, 7):
            (state / str(port)).mkdir(parents=True)
            (state / str(port) / "redis.pid").write_text(str(foreign.pid))
        out = subprocess.run([INFRA / "redis" / "cluster-stop.sh"], capture_output=True,
                             text=True, timeout=60,
                             env={**os.environ, "RANKSTREAM_REDIS_CLUSTER_DIR": str(state),
                                  "RANKSTREAM_REDIS_CLUSTER_PORT": "1"})
        assert out.returncode == 0, out.stderr
        time.sleep(0.3)
        assert foreign.poll() is None, "cluster-stop.sh killed a process that is not its node"
        assert out.stderr.count("another program") == 6
        for script in ("cluster-start.sh", "cluster-stop.sh"):   # state under the user's dirs
            assert "/tmp" not in (INFRA / "redis" / script).read_text(), script
    finally:
        foreign.send_signal(signal.SIGKILL)
        foreign.wait()
