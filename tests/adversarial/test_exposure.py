"""§5 of the adversarial review: inputs and defaults that let others in — a Redis password that
was not percent-encoded (and leaked into errors), shared /tmp defaults, a stop script that
killed a foreign process, model names that broke every DAG, a redis-server that shadowed
Debian's."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from pipeline.serving.lookup import RedisUnavailable, TopK
from pipeline.serving.publish import publish
from pipeline.settings import Settings
from pipeline.training.config import load_models
from tests import airflow_runner
from tests.servers import free_port, infra_server
from tests.serving.helpers import user_model

REPO = Path(__file__).resolve().parents[2]
INFRA = REPO / "infra"
SECRET = "p@ss#w?rd/1&x=y"


@pytest.fixture
def locked_redis(tmp_path):
    """A redis-server of our own, with a password full of URL delimiters."""
    try:
        with infra_server("redis", tmp_path) as port:
            redis.Redis(port=port).config_set("requirepass", SECRET)
            yield port
    except RuntimeError as err:
        pytest.skip(str(err))


def test_a_password_with_url_delimiters_works_from_an_airflow_connection_and_never_shows(
        locked_redis, tmp_path):
    conn = json.dumps({"conn_type": "redis", "host": "127.0.0.1", "port": locked_redis,
                       "password": SECRET})
    code = ("from pipeline.training.airflow_tasks import settings; "
            "print(settings().redis_url); print(repr(settings()))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         env={**os.environ, "AIRFLOW_CONN_RANKSTREAM_REDIS": conn,
                              "AIRFLOW_HOME": str(tmp_path / "airflow")}, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    url, shown = out.stdout.strip().splitlines()[-2:]
    assert SECRET not in url and SECRET not in shown and "***" in shown
    art = user_model(1, n_users=5)
    publish("m", art, url, top_k=3)
    with TopK(url) as topk:
        assert topk.recommend("m", art.key_ids[0], k=3).version == 1
    wrong = url.replace("p%40ss", "nope")
    with TopK(wrong, timeout=2.0) as topk, pytest.raises(Exception) as err:
        topk.recommend("m", art.key_ids[0], k=3)
    assert "p@ss" not in str(err.value) and "p%40ss" not in str(err.value)
    with TopK(f"redis://127.0.0.1:{free_port()}/0", timeout=0.2) as down, \
            pytest.raises(RedisUnavailable) as err:
        down.recommend("m", 1)
    assert SECRET not in str(err.value)
    assert SECRET not in repr(Settings(redis_url=url, kafka_security={"sasl_plain_password":
                                                                          SECRET}))


def test_infra_state_lives_in_the_users_own_directory(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANKSTREAM", "XDG"))}
    env.update(HOME=str(tmp_path), TMPDIR="/tmp")
    out = subprocess.run(["bash", "-c", f". {INFRA}/airflow/env.sh; echo $AIRFLOW_HOME; "
                                        "stat -c %a $AIRFLOW_HOME; umask"],
                         env=env, capture_output=True, text=True, timeout=60)
    home, mode, umask = out.stdout.split()
    assert home == f"{tmp_path}/.local/state/rankstream/airflow" and mode == "700"
    assert umask == "0077"   # the metadata DB, logs and passwords Airflow writes are private
    for script in ("kafka/start.sh", "redis/start.sh"):
        text = (INFRA / script).read_text()
        assert "/tmp" not in text.replace("TMPDIR", ""), script


def test_stop_script_leaves_a_foreign_process_of_a_stale_pid_file_alone(tmp_path):
    foreign = subprocess.Popen(["sleep", "60"])
    try:
        state = tmp_path / "redis-state"
        state.mkdir()
        (state / "redis.pid").write_text(str(foreign.pid))
        out = subprocess.run([INFRA / "redis" / "stop.sh"], capture_output=True, text=True,
                             env={**os.environ, "RANKSTREAM_REDIS_DIR": str(state),
                                  "RANKSTREAM_REDIS_PORT": "1"}, timeout=60)
        assert out.returncode == 0, out.stderr
        time.sleep(0.3)
        assert foreign.poll() is None, "stop.sh killed a process that is not its redis-server"
        assert "another program" in out.stderr and not (state / "redis.pid").exists()
    finally:
        foreign.send_signal(signal.SIGKILL)
        foreign.wait()


def test_infra_runs_debians_redis_server_even_with_the_venv_first_on_path(tmp_path,
                                                                        monkeypatch):
    if not Path("/usr/bin/redis-server").exists():
        pytest.skip("Debian's redis-server is not installed")
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    with infra_server("redis", tmp_path) as port:
        pidfile = tmp_path / "redis" / "redis.pid"
        cmdline = Path(f"/proc/{pidfile.read_text().strip()}/cmdline").read_bytes()
        assert cmdline.startswith(b"/usr/bin/redis-server"), cmdline
        assert redis.Redis(port=port).info()["redis_version"].startswith("7.")


@pytest.mark.parametrize("name", ["m\n", "my model", "a:b", "{x}", ""])
def test_one_name_rule_where_the_config_is_loaded(tmp_path, name):
    path = tmp_path / "models.toml"
    path.write_text(f'[models.{json.dumps(name)}]\nalgorithm = "altsvm"\n')
    with pytest.raises(ValueError, match="model name .* is not valid"):
        load_models(path)


@pytest.mark.airflow
def test_a_bad_model_name_does_not_take_the_other_dags_down(tmp_path):
    config = tmp_path / "models.toml"
    config.write_text('[models."my model"]\nalgorithm = "altsvm"\n\n'
                      '[models.movies]\nalgorithm = "altsvm"\n')
    env = airflow_runner.airflow_env(tmp_path / "home", REPO / "dags",
                                     {"RANKSTREAM_CONFIG": str(config)})
    code = ("import json, sys; from airflow.dag_processing.dagbag import DagBag; "
            "bag = DagBag(dag_folder=sys.argv[1]); "
            "print(json.dumps({'dags': sorted(bag.dag_ids), 'errors': list(bag.import_errors)}))")
    out = subprocess.run([sys.executable, "-c", code, str(REPO / "dags")], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result == {"dags": ["rankstream_movies"], "errors": []}
    assert "'my model' is not valid" in out.stdout + out.stderr   # logged
