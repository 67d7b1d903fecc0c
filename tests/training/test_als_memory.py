"""ALS, the challenger that runs in the trainer's process on every user, keeps to the memory
there is (issue 52, item 7): its search keeps to the factors whose fits need at most half the
memory available, says so, and where even the fewest do not fit it is skipped with one line
and the run goes on without it."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.ingest import synthetic
from pipeline.ingest.files import ingest_files
from pipeline.settings import Settings
from pipeline.training import retrain
from pipeline.training.config import parse_model
from pipeline.training.trainers import als, ease


def _arrays(rows: int, users: int, items: int) -> dict:
    return {"met_user": np.zeros(rows, np.int32), "user_ids": np.arange(users),
            "item_ids": np.arange(items)}


def test_the_factors_kept_are_those_whose_fits_take_half_the_memory_at_most():
    arrays = _arrays(10**6, 40_000, 40_000)
    assert als.fitting_factors(arrays, None) == (als.ALS_AXES["factors"], None)
    assert als.fitting_factors(arrays, 2**40) == (als.ALS_AXES["factors"], None)
    need = {f: als.fit_bytes(10**6, 40_000, 40_000, f) for f in als.ALS_AXES["factors"]}
    factors, why = als.fitting_factors(arrays, 2 * need[64])
    assert factors == [16, 32, 64]
    assert why.startswith("1,000,000 met rows of 40,000 users and 40,000 items need ") \
        and f"{need[128] / 2**30:.1f} GiB for ALS with 128 factors" in why and "\n" not in why
    factors, why = als.fitting_factors(arrays, 2 * need[16] - 2)
    assert factors == [] and "GiB for ALS with 16 factors" in why

@pytest.mark.filterwarnings("ignore::solvers.ConvergenceWarning")
@pytest.mark.parametrize("fewest", [32, None], ids=["factors bound", "skipped"])
def test_a_run_keeps_als_to_the_memory_or_goes_on_without_it(tmp_path, redis_url, monkeypatch,
                                                             fewest):
    settings = Settings(home=tmp_path / "home", namespace=f"a{tmp_path.name[-12:]}")
    events = synthetic.rating_events(n_users=200, n_items=120, per_user=25, seed=2)
    ingest_files([synthetic.write_jsonl(events, settings.home / "in" / "r.jsonl")], "rating",
                 settings=settings, progress=False)
    met = {(e["user"], e["item"]) for e in events}
    sizes = (len(met), len({u for u, _ in met}), len({i for _, i in met}))
    available = 2 * als.fit_bytes(*sizes, fewest) if fewest else 2 * als.fit_bytes(*sizes, 16) - 2
    monkeypatch.setattr(ease, "available_memory", lambda: available)
    raw = {"algorithm": "altsvm", "kinds": ["rating"], "evaluation": {"holdout": 4},
           "params": {"item_bias": True, "max_iter": 30, "random_state": 0, "n_threads": 1,
                      "rank": 4, "reg_ratio": 0.3},
           "gate": {"challenger": ["als", "ease"]},
           "tune": {"budget_seconds": 30, "max_settings": 3, "challenger_settings": 6}}
    run = retrain.run("movies", {"movies": parse_model("movies", raw, "test")},
                      settings=settings, redis_url=redis_url)
    ch = run["train"]["challenger"]
    assert ch["name"] == "als" and run["decision"] == "published", run.get("reason")
    if fewest:
        searched = [t for t in ch["tried"] if "params" in t and "factors" in t["params"]]
        assert searched and {t["params"]["factors"] for t in searched} <= {16, 32}, searched
        assert ch["tried"][-1]["chosen"]["factors"] <= 32
        assert "factors kept to 32 or fewer: " in ch["warning"] and "\n" not in ch["warning"]
        assert run["gate"]["metric"] in ch["metrics"]
    else:
        assert ch["skipped"].startswith("ALS skipped: ") and "\n" not in ch["skipped"]
        assert not ch["metrics"]
        assert "challenger-als" not in str(run["gate"].get("publishes"))
