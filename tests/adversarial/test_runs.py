"""§4 of the adversarial review: runs that fight each other or never recover — concurrent
trains, a checkpoint that no longer fits the model, Redis restarted empty, a killed demo that
left its redis-server behind, a restarted consumer that sat idle for 44 s."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

from pipeline.ingest import synthetic
from pipeline.ingest.files import ingest_files
from pipeline.ingest.kafka import new_group_id
from pipeline.ingest.local_store import LocalEventStore
from pipeline.ingest.producer import EventProducer
from pipeline.serving.lookup import TopK
from pipeline.serving.versions import versions
from pipeline.settings import Settings
from pipeline.training import retrain
from pipeline.training.config import parse_model
from tests import airflow_runner
from tests.ingest.factory import REPO, cli_ingest, make_event, new_topic

CONFIG = """
[models.movies]
algorithm = "altsvm"
kinds = ["rating"]
evaluation = {{ holdout = 2 }}
gate = {{ tolerance = 1.0, trivial_margin = -1.0 }}   # these tests are about runs, not quality

[models.movies.params]
rank = {rank}
reg_ratio = 0.3
item_bias = true
comparisons = "mixed"
random_state = 0
n_threads = 1
"""


def _ingest(home: Path, events, name="r"):
    path = synthetic.write_jsonl(events, home / "in" / f"{name}.jsonl")
    ingest_files([path], "rating", settings=Settings(home=home), progress=False)


def _ratings(seed=3, **kw):
    return synthetic.rating_events(n_users=80, n_items=50, per_user=20, seed=seed, **kw)


def _train(home, config, redis_url, namespace, *extra) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "pipeline.cli", "train", "movies",
                             "--config", str(config), "--home", str(home), "--redis-url",
                             redis_url, "--namespace", namespace, *extra],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


@pytest.mark.parametrize("wait", [False, True])
def test_three_trains_of_one_model_at_once_publish_one_version(tmp_path, redis_url,
                                                              redis_client, wait):
    config = tmp_path / "models.toml"
    config.write_text(CONFIG.format(rank=4))
    home = tmp_path / "home"
    _ingest(home, _ratings())
    namespace = f"lock{int(wait)}"
    runs = [_train(home, config, redis_url, namespace, *(["--wait"] if wait else []))
            for _ in range(3)]
    outs = [(p.wait(timeout=300), *p.communicate()) for p in runs]
    published = [o for o in outs if "published" in o[1]]
    assert len(published) == 1, outs
    if wait:   # the others waited, then found the window unchanged
        assert all(code == 0 for code, *_ in outs), outs
        assert sum("unchanged" in out for _, out, _ in outs) == 2, outs
    else:      # the others refused at once, saying who holds the model
        busy = [o for o in outs if o[0] == 1]
        assert len(busy) == 2 and all("is being retrained by pid" in e for *_, e in busy), outs
    assert [v.version for v in versions("movies", redis_client, namespace=namespace)] == [1]


def test_a_checkpoint_of_another_config_is_left_alone_and_the_run_trains_cold(
        tmp_path, redis_url, redis_client):
    home = tmp_path / "home"
    settings = Settings(home=home, namespace="setaside")
    events = _ratings()
    _ingest(home, events[:1200])

    def models(rank):
        spec = {"algorithm": "altsvm", "kinds": ["rating"],
                "params": {"rank": rank, "reg_ratio": 0.3, "random_state": 0, "n_threads": 1},
                "evaluation": {"holdout": 2},
                "gate": {"tolerance": 1.0, "trivial_margin": -1.0}}   # about runs, not quality
        return {"movies": parse_model("movies", spec, "test")}

    assert retrain.run("movies", models(6), settings=settings,
                       redis_url=redis_url)["decision"] == "published"
    _ingest(home, events[1200:], "r2")
    production = sorted(p.name for p in (settings.checkpoint_dir / "movies").iterdir())
    # a trial of another rank (no publish): trains cold, touches no checkpoint
    with pytest.warns(RuntimeWarning, match="cannot warm-start this model .*rank.* left as it"):
        trial = retrain.run("movies", models(3), settings=settings, redis_url=redis_url,
                            publish=False)
    assert not trial["train"]["warm_start"]
    assert sorted(p.name for p in (settings.checkpoint_dir / "movies").iterdir()) == production
    # the new config for real (the trial's fit of the same window is reused): cold,
    # published; its checkpoint is the next run's warm start
    out = retrain.run("movies", models(3), settings=settings, redis_url=redis_url)
    assert out["decision"] == "published" and not out["train"]["warm_start"]
    assert "rank" in out["train"]["warm_start_failed"]
    assert not (settings.checkpoint_dir / "movies" / ".set-aside").exists()
    with warnings.catch_warnings():       # the next run warm-starts from the new checkpoint
        warnings.simplefilter("error")
        _ingest(home, _ratings(seed=4, id_prefix="n"), "r3")
        again = retrain.run("movies", models(3), settings=settings, redis_url=redis_url)
    assert again["train"]["warm_start"]


@pytest.mark.airflow
def test_changing_rank_between_two_dag_runs(tmp_path, airflow_home, redis_url, redis_client):
    """The DAG (which cannot say --cold) keeps publishing after the config changes rank."""
    home = tmp_path / "home"
    _ingest(home, _ratings()[:1200])
    config = tmp_path / "models.toml"
    env = airflow_runner.airflow_env(airflow_home, REPO / "dags", {
        "RANKSTREAM_CONFIG": str(config), "RANKSTREAM_HOME": str(home),
        "RANKSTREAM_NAMESPACE": "dagrank", "AIRFLOW_CONN_RANKSTREAM_REDIS": redis_url})
    for rank in (6, 3):
        config.write_text(CONFIG.format(rank=rank))
        run = airflow_runner.dags_test(env, "rankstream_movies")
        assert run.returncode == 0, run.stdout[-5000:]
    assert [v.version for v in versions("movies", redis_client, namespace="dagrank")] == [1, 2]


def test_redis_restarted_empty_gets_the_model_again_without_new_data(tmp_path, redis_url,
                                                                    redis_client):
    home = tmp_path / "home"
    settings = Settings(home=home, namespace="flushed")
    _ingest(home, _ratings())
    models = {"movies": parse_model("movies", {
        "algorithm": "altsvm", "params": {"rank": 4, "reg_ratio": 0.3, "random_state": 0,
                                          "n_threads": 1}, "evaluation": {"holdout": 2}},
        "test")}
    assert retrain.run("movies", models, settings=settings,
                       redis_url=redis_url)["decision"] == "published"
    redis_client.flushdb()                             # Redis restarted without persistence
    out = retrain.run("movies", models, settings=settings, redis_url=redis_url)
    assert out["decision"] == "republished", out
    with TopK(redis_url, namespace="flushed") as topk:
        assert len(topk.recommend("movies", _ratings()[0]["user"], k=3).items) == 3
    assert retrain.run("movies", models, settings=settings,
                       redis_url=redis_url)["decision"] == "unchanged"


def _children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            pass
    return out


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_killed_demo_leaves_no_redis_server_behind(tmp_path, sig):
    demo = subprocess.Popen([sys.executable, "-m", "pipeline.cli", "demo", "--home",
                             str(tmp_path / "demo"), "--users", "200", "--items", "100"],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    deadline = time.monotonic() + 120
    servers = []
    while time.monotonic() < deadline and not servers:
        servers = [c for c in _children(demo.pid)
                   if "redis-server" in Path(f"/proc/{c}/cmdline").read_text()]
        time.sleep(0.05)
    assert servers, "the demo never started its embedded redis-server"
    demo.send_signal(sig)
    demo.wait(timeout=60)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(Path(f"/proc/{s}").exists() for s in servers):
        time.sleep(0.05)
    alive = [s for s in servers if Path(f"/proc/{s}").exists()
             and Path(f"/proc/{s}/stat").read_text().split()[2] != "Z"]
    assert not alive, f"redis-server {alive} outlived the demo ({sig.name})"


def test_a_restarted_consumer_resumes_at_once_without_an_instance_id(kafka_bootstrap,
                                                                    tmp_path):
    """Without --instance-id the consumer takes a static member id stable per host and slot,
    so the restart after a SIGKILL takes the dead one's partitions at once (before: it sat
    idle until the dead member's session expired, 44 s)."""
    import random

    topic = new_topic(kafka_bootstrap, partitions=2, prefix="restart")
    home = tmp_path / "home"
    store = LocalEventStore(home / "store", home / "dead-letter")
    rng = random.Random(5)
    common = ("--group", new_group_id("restart"), "--flush-interval", "0.2",
              "--dead-letter-topic", f"dlq-{topic}")

    def produce(start):
        with EventProducer(kafka_bootstrap) as producer:
            for i in range(start, start + 200):
                producer.send(topic, make_event("rating", i, rng))

    def stored():
        return sum(store.next_offsets().values())

    produce(0)
    child = cli_ingest(home, kafka_bootstrap, topic, *common)
    try:
        deadline = time.monotonic() + 60
        while stored() < 200 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert stored() == 200, (home / "child.log").read_text()[-3000:]
        child.send_signal(signal.SIGKILL)
        child.wait()
        produce(200)
        started = time.monotonic()
        child = cli_ingest(home, kafka_bootstrap, topic, *common)
        while stored() < 400 and time.monotonic() - started < 60:
            time.sleep(0.1)
        waited = time.monotonic() - started
        print(f"the restarted consumer stored the new events after {waited:.1f} s")
        assert stored() == 400 and waited < 20, (waited, (home / "child.log").read_text()[-2000:])
    finally:
        child.send_signal(signal.SIGTERM)
        child.wait(timeout=60)
