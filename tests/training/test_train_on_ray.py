"""``RANKSTREAM_RAY_ADDRESS=… rankstream train movies`` is the whole difference (issue 52): the
same events trained by the CLI in this process's way and on a real local Ray cluster
(``infra/ray/start.sh``) give the same checkpoint, factor for factor and dual for dual, and
publish the same lists."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pipeline.ingest import synthetic
from pipeline.ingest.files import ingest_files
from pipeline.serving.lookup import TopK
from pipeline.settings import Settings
from pipeline.training.checkpoints import latest_checkpoint

REPO = Path(__file__).resolve().parents[2]
CONFIG = """
[models.movies]
algorithm = "altsvm"
kinds = ["rating"]
gate = { tolerance = 1.0, trivial_margin = -1.0 }

[models.movies.params]
rank = 4
reg_ratio = 0.3
item_bias = true
max_iter = 8
random_state = 0
"""
# a search on a sample of 100 users: its rank check's two fits on every user run on Ray too
SAMPLED = CONFIG.replace("reg_ratio = 0.3\n", "").replace(
    "gate = { tolerance = 1.0, trivial_margin = -1.0 }",
    "gate = { tolerance = 1.0, trivial_margin = -1.0 }\ntune = { max_settings = 2, "
    "budget_seconds = 600, sample_users = 100, rank = [4, 8], loss = [\"squared_hinge\"] }")


def _train(home: Path, config: Path, redis_url: str, namespace: str, **env) -> str:
    run = subprocess.run([sys.executable, "-m", "pipeline.cli", "train", "movies", "--config",
                          str(config), "--home", str(home), "--redis-url", redis_url,
                          "--namespace", namespace, "--no-progress"], cwd=REPO, text=True,
                         capture_output=True, timeout=600,
                         env={**{k: v for k, v in os.environ.items()
                                 if k != "RANKSTREAM_RAY_ADDRESS"}, **env})
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout


@pytest.mark.parametrize("text", [CONFIG, SAMPLED], ids=["fixed", "sampled-search"])
def test_a_train_on_a_ray_cluster_publishes_the_local_bits(tmp_path, redis_url, ray_address,
                                                           text):
    config = tmp_path / "models.toml"
    config.write_text(text)
    events = synthetic.rating_events(n_users=300, n_items=120, per_user=25, seed=4)
    homes = {}
    for where, env in (("local", {}), ("ray", {"RANKSTREAM_RAY_ADDRESS": ray_address})):
        home = homes[where] = tmp_path / where
        path = synthetic.write_jsonl(events, home / "in" / "ratings.jsonl")
        ingest_files([path], "rating", settings=Settings(home=home), progress=False)
        out = _train(home, config, redis_url, f"onray-{where}", **env)
        assert "published" in out, out
        (train,) = (home / "runs" / "movies").glob("*/train.json")
        summary = json.loads(train.read_text())
        assert summary["engine"].startswith("Ray at " if where == "ray" else "this process")
        if text is SAMPLED:
            assert [c["params"]["rank"] for c in summary["tuning"]["confirmed"]] == [4, 8]
    local, ray = (latest_checkpoint(Settings(home=homes[w]).checkpoint_dir, "movies")
                  for w in ("local", "ray"))
    warm = sorted(k for k in local.arrays if k.startswith("warm_"))
    assert {"warm_U", "warm_V", "warm_alpha", "warm_beta"} <= set(warm)
    for key in warm:
        assert np.array_equal(local.arrays[key], ray.arrays[key]), key
    user = events[0]["user"]
    with TopK(redis_url, namespace="onray-local") as a, \
            TopK(redis_url, namespace="onray-ray") as b:
        assert a.recommend("movies", user, k=10).items == b.recommend("movies", user,
                                                                        k=10).items
