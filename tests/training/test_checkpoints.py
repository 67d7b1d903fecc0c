"""Checkpoints, id maps and model configs: the pure parts of the retrain loop."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from pipeline.training.checkpoints import (
    latest_checkpoint,
    prune_checkpoints,
    read_checkpoint,
    write_checkpoint,
)
from pipeline.training.config import load_models
from pipeline.training.idmap import IdMap


def test_idmap_extends_without_renumbering():
    rng = np.random.default_rng(0)
    m = IdMap()
    seen: dict[str, int] = {}
    for _ in range(20):
        batch = rng.integers(0, 300, size=50).astype(str)
        m, idx = m.extend(batch)
        for external, index in zip(batch, idx):
            assert seen.setdefault(external, int(index)) == index
    assert sorted(seen.values()) == list(range(len(m)))
    assert m.lookup(np.array(["nope", m.ids[3]])).tolist() == [-1, 3]


def test_idmap_rejects_duplicates():
    with pytest.raises(ValueError, match="'a' appears more than once"):
        IdMap(["a", "b", "a"])


def test_checkpoint_round_trip_and_latest(tmp_path):
    for i in range(4):
        write_checkpoint(tmp_path / "m" / f"run{i}", arrays={"x": np.arange(i + 1),
                                                           "ids": np.array(["a", "é"])},
                         manifest={"model": "m", "algorithm": "altsvm",
                                   "metrics": {"ndcg@10": i / 10}})
    ckpt = latest_checkpoint(tmp_path, "m", algorithm="altsvm")
    assert ckpt.run_id == "run3"
    assert ckpt.arrays["x"].tolist() == [0, 1, 2, 3]
    assert ckpt.arrays["ids"].tolist() == ["a", "é"]
    assert ckpt.manifest["metrics"]["ndcg@10"] == 0.3
    removed = prune_checkpoints(tmp_path, "m", keep=2)
    assert sorted(p.name for p in removed) == ["run0", "run1"]
    assert [p.name for p in (tmp_path / "m").iterdir()] != []


def test_pruning_also_bounds_the_set_aside_checkpoints(tmp_path):
    aside = tmp_path / "m" / ".set-aside"
    for i in range(5):
        (aside / f"run{i}").mkdir(parents=True)
    write_checkpoint(tmp_path / "m" / "run9", arrays={"x": np.ones(1)},
                     manifest={"model": "m", "algorithm": "altsvm"})
    removed = prune_checkpoints(tmp_path, "m", keep=2)
    assert sorted(p.name for p in removed) == ["run0", "run1", "run2"]
    assert sorted(p.name for p in aside.iterdir()) == ["run3", "run4"]
    assert (tmp_path / "m" / "run9").is_dir()


def test_corrupt_checkpoint_warns_and_falls_back(tmp_path):
    write_checkpoint(tmp_path / "m" / "run1", arrays={"x": np.ones(3)},
                     manifest={"model": "m", "algorithm": "altsvm"})
    bad = write_checkpoint(tmp_path / "m" / "run2", arrays={"x": np.ones(3)},
                           manifest={"model": "m", "algorithm": "altsvm"})
    (bad / "arrays.npz").write_bytes(b"not a zip file")
    with pytest.warns(RuntimeWarning, match="run2 cannot be read .*; moved to .*set-aside"):
        ckpt = latest_checkpoint(tmp_path, "m")
    assert ckpt.run_id == "run1"
    with pytest.raises(ValueError, match="corrupt|unreadable"):
        read_checkpoint(tmp_path / "m" / ".set-aside" / "run2")


def test_incompatible_format_version_is_skipped(tmp_path):
    path = write_checkpoint(tmp_path / "m" / "run1", arrays={"x": np.ones(1)},
                            manifest={"model": "m", "algorithm": "altsvm"})
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["format_version"] = 99
    (path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.warns(RuntimeWarning, match="format_version 99"):
        assert latest_checkpoint(tmp_path, "m") is None


def test_another_models_or_algorithms_checkpoint_is_set_aside(tmp_path):
    write_checkpoint(tmp_path / "m" / "run1", arrays={"x": np.ones(1)},
                     manifest={"model": "m", "algorithm": "altsvm"})
    write_checkpoint(tmp_path / "m" / "run2", arrays={"x": np.ones(1)},
                     manifest={"model": "other", "algorithm": "altsvm"})
    write_checkpoint(tmp_path / "m" / "run3", arrays={"x": np.ones(1)},
                     manifest={"model": "m", "algorithm": "toppush"})
    with pytest.warns(RuntimeWarning) as caught:
        assert latest_checkpoint(tmp_path, "m", algorithm="altsvm").run_id == "run1"
    messages = [str(w.message) for w in caught]
    assert any("run3 is for algorithm 'toppush'" in m for m in messages)
    assert any("run2 belongs to model 'other', not 'm'" in m for m in messages)
    assert sorted(p.name for p in (tmp_path / "m" / ".set-aside").iterdir()) == ["run2", "run3"]


def test_object_arrays_are_refused(tmp_path):
    with pytest.raises(TypeError, match="pickle"):
        write_checkpoint(tmp_path / "m" / "r", arrays={"o": np.array([{}], dtype=object)},
                         manifest={})
    assert latest_checkpoint(tmp_path, "m") is None


def test_model_config_validation_names_the_problem(tmp_path):
    good = tmp_path / "good.toml"
    good.write_text('[models.movies]\nalgorithm = "altsvm"\nparams = { rank = 8 }\n'
                    '[models.ads]\nalgorithm = "toppush"\nkinds = ["outcome"]\n')
    models = load_models(good)
    assert models["movies"].metric == "topk_ndcg@10" and models["movies"].params == {"rank": 8}
    assert models["ads"].metric == "pos@top" and models["ads"].publish["top_k"] == 100
    cases = {
        'algorithm = "svm"': "algorithm 'svm'",
        'algorithm = "toppush"\nkinds = ["rating"]': "kinds ['rating']",
        'algorithm = "altsvm"\nwindow = { last_days = -1 }': "window.last_days is -1",
        'algorithm = "altsvm"\nevaluation = { metric = "auc" }': "metric is 'auc'",
        'algorithm = "altsvm"\ncolour = "red"': "unknown keys ['colour']",
        'algorithm = "altsvm"\nparams = { rnak = 3 }':
            "unknown params keys ['rnak']; allowed: ['comparisons', 'deterministic', "
            "'implicit_max_comparisons', 'implicit_max_per_positive', 'implicit_min_rating', "
            "'implicit_per_item', 'implicit_per_user', "
            "'implicit_sampling', 'item_bias', 'loss', 'max_iter', 'max_pairs_per_user', "
            "'n_threads', 'random_state', 'rank', 'rating_range', 'reg', 'reg_path', "
            "'reg_ratio', 'tol', 'verbose']",
        'algorithm = "toppush"\nparams = { max_pairs_per_user = 3 }':
            "unknown params keys ['max_pairs_per_user']",
        'algorithm = "altsvm"\nevaluation = { split = "by_day" }':
            "split is 'by_day', expected one of ['per_user_last', 'random']",
        'algorithm = "toppush"\nevaluation = { split = "per_user_last" }':
            "split is 'per_user_last', expected one of ['random']",
        'algorithm = "altsvm"\nevaluation = { holdot = 3 }': "unknown evaluation keys ['holdot']",
        'algorithm = "altsvm"\nevaluation = { k = 5, metric = "ndcg@10" }':
            "metric is 'ndcg@10', expected one of ['topk_ndcg@5', 'topk_precision@5', "
            "'topk_recall@5', 'ndcg@5', 'precision@5', 'pairwise_accuracy']",
        'algorithm = "altsvm"\ngate = { tolerence = 0.1 }': "unknown gate keys ['tolerence']",
    }
    for body, message in cases.items():
        bad = tmp_path / "bad.toml"
        bad.write_text(f"[models.x]\n{body}\n")
        with pytest.raises(ValueError, match=re.escape(message)):
            load_models(bad)


def test_evaluation_k_and_relevance_come_from_the_config(tmp_path):
    path = tmp_path / "m.toml"
    path.write_text('[models.m]\nalgorithm = "altsvm"\n'
                    'evaluation = { k = 5, relevance = 8.0, split = "random" }\n')
    cfg = load_models(path)["m"]
    assert cfg.metric == "topk_ndcg@5" and cfg.evaluation["relevance"] == 8.0
    assert cfg.evaluation["split"] == "random" and cfg.evaluation["fraction"] == 0.2


def test_shipped_model_configs_are_valid_and_cover_every_family():
    """dags/models.toml (production) and the demo's own file, one source each, through the
    same validation; the demo runs one model of every family, under the same names."""
    from pathlib import Path

    from pipeline.cli.demo import DEMO_MODELS
    from pipeline.training.registry import FAMILIES

    shipped = load_models(Path(__file__).resolve().parents[2] / "dags" / "models.toml")
    demo = load_models(DEMO_MODELS)
    for models in (shipped, demo):
        assert sorted(m.algorithm for m in models.values()) == sorted(FAMILIES)
    assert {n: m.algorithm for n, m in demo.items()} == {n: m.algorithm
                                                         for n, m in shipped.items()}
