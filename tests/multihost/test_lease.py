"""One retrain per model across hosts: two `rankstream train` processes with their own HOMEs
(as two hosts have) on one real Redis. While one holds the model's lease the other refuses
(or waits with --wait); a run whose lease was revoked or expired while it was paused cannot
publish over the run that took the lease after it (its flip is refused: exit status 4), and
the version it wrote is gone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import redis

from pipeline.ingest import synthetic
from pipeline.ingest.files import ingest_files
from pipeline.serving.layout import ModelKeys
from pipeline.serving.lease import Lease, LeaseHeldError, revoke
from pipeline.serving.publish import FencedError, publish
from pipeline.settings import Settings
from tests.ingest.factory import REPO
from tests.serving.helpers import user_model

CONFIG = """
[models.movies]
algorithm = "altsvm"
kinds = ["rating"]
params = { rank = 16, item_bias = true, random_state = 0, n_threads = 1, max_iter = 60 }
evaluation = { holdout = 4 }
"""


@pytest.fixture
def hosts(tmp_path, redis_url, redis_client):
    """Two HOMEs holding the same events, one config, one namespace: (config, [home a, home b],
    namespace)."""
    config = tmp_path / "models.toml"
    config.write_text(CONFIG)
    events = synthetic.rating_events(n_users=600, n_items=300, per_user=40, seed=5)
    path = synthetic.write_jsonl(events, tmp_path / "r.jsonl")
    homes = [tmp_path / "host-a", tmp_path / "host-b"]
    for home in homes:
        ingest_files([path], "rating", settings=Settings(home=home), progress=False)
    return config, homes, f"lease{tmp_path.name[-8:]}"


def _train(config, home, redis_url, namespace, *extra, ttl: float = 30.0) -> subprocess.Popen:
    env = {**os.environ, "RANKSTREAM_LEASE_TTL": str(ttl)}
    return subprocess.Popen(
        [sys.executable, "-m", "pipeline.cli", "train", "movies", "--config", str(config),
         "--home", str(home), "--redis-url", redis_url, "--namespace", namespace, *extra],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for_lease(client, keys: ModelKeys, timeout: float = 60.0) -> bytes:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        held = client.get(keys.lease)
        if held is not None:
            return held
        time.sleep(0.02)
    raise TimeoutError("no run took the lease")


def _versions(client, keys: ModelKeys) -> list[int]:
    return [int(v) for v in client.lrange(keys.versions, 0, -1)]


def test_a_second_host_refuses_while_the_first_holds_the_lease(hosts, redis_url, redis_client):
    config, (home_a, home_b), namespace = hosts
    keys = ModelKeys(namespace, "movies")
    held = Lease.acquire(redis_url, namespace, "movies", holder="pid 1 on host-a since now")
    refused = _train(config, home_b, redis_url, namespace)
    out, err = refused.communicate(timeout=120)
    assert refused.returncode == 1 and "held by pid 1 on host-a" in err, err
    assert len(err.strip().splitlines()) == 1 and _versions(redis_client, keys) == []
    held.release()
    # both hosts at once, the second waiting for the first: both run, one after the other
    runs = [_train(config, home, redis_url, namespace, "--wait", "120")
            for home in (home_a, home_b)]
    results = [(p.wait(timeout=300), p.stdout.read()) for p in runs]
    assert [rc for rc, _ in results] == [0, 0], [p.stderr.read() for p in runs]
    assert _versions(redis_client, keys) == [1, 2]          # strictly increasing, none lost
    assert redis_client.get(keys.lease) is None            # both gave it back


def test_a_revoked_run_cannot_publish(hosts, redis_url, redis_client):
    config, (home_a, _), namespace = hosts
    keys = ModelKeys(namespace, "movies")
    run = _train(config, home_a, redis_url, namespace)
    _wait_for_lease(redis_client, keys)
    os.kill(run.pid, signal.SIGSTOP)        # keep it mid-run while the lease is revoked
    try:
        assert revoke(redis_url, namespace, "movies") is not None
    finally:
        os.kill(run.pid, signal.SIGCONT)
    out, err = run.communicate(timeout=300)
    assert run.returncode == 4, (out, err)
    assert "fenced" in out and "no longer held" in out
    assert _versions(redis_client, keys) == [] and redis_client.get(keys.current) is None
    assert not redis_client.keys(keys.tag + ":v*")          # the refused version is gone


def test_a_paused_run_whose_lease_expired_loses_to_the_run_after_it(hosts, redis_url,
                                                                    redis_client):
    """Host A pauses past its lease's TTL (a GC pause, a frozen VM); host B takes the lease
    and publishes; A wakes up and finishes: its flip is refused, B's version stays served."""
    config, (home_a, home_b), namespace = hosts
    keys = ModelKeys(namespace, "movies")
    a = _train(config, home_a, redis_url, namespace, ttl=1.0)
    first_token = int(_wait_for_lease(redis_client, keys).split()[0])
    os.kill(a.pid, signal.SIGSTOP)
    try:
        time.sleep(1.5)                     # A's lease expires (its renewer is paused too)
        b = _train(config, home_b, redis_url, namespace, ttl=1.0)
        out_b, err_b = b.communicate(timeout=300)
        assert b.returncode == 0 and "published" in out_b, err_b
    finally:
        os.kill(a.pid, signal.SIGCONT)
    out_a, err_a = a.communicate(timeout=300)
    assert a.returncode == 4, (out_a, err_a)
    assert _versions(redis_client, keys) == [1] or _versions(redis_client, keys) == [2]
    served = redis_client.get(keys.current).decode()
    assert int(served.split(":")[0]) == _versions(redis_client, keys)[0]
    assert first_token < int(redis_client.get(keys.lease_seq))


def test_a_run_killed_on_this_machine_frees_its_lease_at_once(hosts, redis_url,
                                                              redis_client):
    """A `rankstream train` SIGKILLed holding the lease (an OOM kill, a crash) cannot renew or
    release it; a run on the same machine sees its holder's process is gone and takes the
    lease without waiting out the TTL, while a holder it cannot see (another host, another
    container) still blocks it."""
    config, (home_a, home_b), namespace = hosts
    keys = ModelKeys(namespace, "movies")
    killed = _train(config, home_a, redis_url, namespace, ttl=600.0)
    _wait_for_lease(redis_client, keys)
    killed.kill()                           # the process this test started
    killed.wait(timeout=30)
    assert redis_client.pttl(keys.lease) > 500_000          # the lease outlives its holder
    after = _train(config, home_b, redis_url, namespace, ttl=600.0)
    out, err = after.communicate(timeout=300)
    assert after.returncode == 0 and "published" in out, err
    elsewhere = Lease.acquire(redis_url, namespace, "movies",
                              holder="pid 1 on host-c since now\tanother-machine")
    from pipeline.training.lock import _dead_here

    try:
        with pytest.raises(LeaseHeldError, match=r"held by pid 1 on host-c since now \(lease"):
            Lease.acquire(redis_url, namespace, "movies", holder="me", is_dead=_dead_here)
    finally:
        elsewhere.release()


def test_a_fenced_publish_leaves_current_where_it_was(redis_url, redis_client):
    lease = Lease.acquire(redis_url, "fence", "m", holder="test", ttl=5.0)
    assert publish("m", user_model(0), redis_client, namespace="fence",
                   fence=lease.token).version == 1
    revoke(redis_url, "fence", "m")
    with pytest.raises(FencedError, match="expired or was revoked"):
        publish("m", user_model(1), redis_client, namespace="fence", fence=lease.token)
    later = Lease.acquire(redis_url, "fence", "m", holder="next", ttl=5.0)
    with pytest.raises(FencedError, match="holds it"):     # an old token never wins again
        publish("m", user_model(1), redis_client, namespace="fence", fence=lease.token)
    with pytest.raises(LeaseHeldError, match="held by next"):
        Lease.acquire(redis_url, "fence", "m", holder="third")
    keys = ModelKeys("fence", "m")
    assert redis_client.get(keys.current).startswith(b"1:")
    assert publish("m", user_model(2), redis_client, namespace="fence",
                   fence=later.token).version == 4
    lease.release()                         # not its lease any more: leaves it alone
    assert later.held() and later.renew()
    later.release()
    assert redis_client.get(keys.lease) is None
    assert isinstance(redis_client, redis.Redis)
