"""Every served version can do its model's job (issue 51): a model whose answers include
scoring rows given in a request carries what scores them, whatever the gate serves. The
`ads` family (TopPush, its logistic challenger, the best single feature) and the `search`
family (kernel RankSVM, the linear challenger, the best single feature) each publish a scorer
that reproduces the candidate's own scores; published to a real redis-server, `TopK.rank`
scores rows the run never saw (new ads, a new query's docs) exactly as the model does."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pipeline.ingest import synthetic
from pipeline.ingest.files import ingest_files
from pipeline.serving.artifact import ModelArtifact
from pipeline.serving.lookup import TopK
from pipeline.serving.publish import publish
from pipeline.settings import Settings
from pipeline.training import retrain
from pipeline.training.arrays import csr_from_arrays
from pipeline.training.config import parse_model
from pipeline.training.run_types import DATASET_FORMAT
from solvers.persist import read_bundle

CONFIGS = {
    "ads": ("outcome", lambda: synthetic.outcome_events(n_items=800, n_features=12,
                                                        positive_rate=0.1, seed=2),
            {"algorithm": "toppush", "kinds": ["outcome"], "params": {"reg": 1.0},
             "evaluation": {"metric": "average_precision"},
             "gate": {"challenger": "logistic", "if_trivial": "publish_trivial"}}),
    "search": ("judgment", lambda: synthetic.judgment_events(n_queries=50, docs_per_query=10,
                                                             n_features=6, seed=2),
               {"algorithm": "kernel_ranksvm", "kinds": ["judgment"],
                "params": {"n_threads": 1}, "gate": {"challenger": "linear"}}),
}


@pytest.mark.filterwarnings("ignore::solvers.DegenerateFitWarning")
@pytest.mark.filterwarnings("ignore::solvers.ConvergenceWarning")
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_every_candidate_carries_a_scorer_of_its_own_scores(tmp_path, redis_url, redis_client,
                                                           name):
    kind, make, spec = CONFIGS[name]
    settings = Settings(home=tmp_path / "home", namespace=f"s{tmp_path.name[-10:]}")
    ingest_files([synthetic.write_jsonl(make(), tmp_path / "events.jsonl")], kind,
                 settings=settings, progress=False)
    models = {name: parse_model(name, spec, "test")}
    run = retrain.run(name, models, settings=settings, redis_url=redis_url)
    run_dir = Path(run["dataset"]["run_dir"])
    arrays = read_bundle(run_dir / "dataset", fmt=DATASET_FORMAT)[1]
    X = csr_from_arrays(arrays).toarray()
    candidates = [d for d in run_dir.iterdir() if (d / "manifest.json").is_file()
                  and d.name not in ("dataset", "checkpoint")]
    if run["publish"]["published"]:
        candidates.append(Path(run["publish"]["checkpoint"]) / "artifact")
    assert len(candidates) >= 2, candidates          # the model or a rival, and a trivial one
    for where in candidates:
        art = ModelArtifact.load(where)
        assert art.scorer is not None, f"{where} has no scorer"
        scores = art.scorer.score(art.scorer.rows(X.tolist()))
        listed = art.list_scores if art.kind == "query_docs" else art.item_scores
        # the scorer ranks the training rows as the candidate's own list does
        if art.kind == "query_docs":
            order = np.lexsort((arrays["doc"], arrays["query"]))
            np.testing.assert_allclose(scores[order], listed, rtol=1e-4, atol=1e-4)
        else:      # the same scores, up to a shift (a logistic regression's intercept)
            assert np.ptp(scores - listed) < 1e-4, where
    # the gate decided on intervals over the family's units, every candidate's (the trivial
    # one's too) reproducing its recorded holdout metric, the lifts paired with the trivial's
    found = run["train"]["holdout_intervals"]
    assert found["unit"] == {"ads": "positives", "search": "queries"}[name]
    assert {"model", f"challenger-{spec['gate']['challenger']}",
            "trivial-best_feature"} <= set(found["candidates"])
    for choice, got in found["candidates"].items():
        low, high = got["interval"]
        assert low <= got["value"] + 1e-5 and got["value"] <= high + 1e-5, choice
    test = arrays["test_mask"]
    held = (np.unique(arrays["query"][test]).size if name == "search"
            else int(arrays["y"][test].sum()))
    assert found["units"] == held >= 5
    assert set(found["lift"]) == set(found["candidates"]) - {"trivial-best_feature"}
    # served over Redis: rows the run never saw are scored by the served version's scorer
    served = ModelArtifact.load(Path(run["publish"]["checkpoint"]) / "artifact")
    publish(name, served, redis_client, namespace=settings.namespace)
    rng = np.random.default_rng(5)
    new = rng.random((7, X.shape[1])).round(3)
    with TopK(redis_url, namespace=settings.namespace) as topk:
        got = topk.rank(name, [(f"new{i}", row.tolist()) for i, row in enumerate(new)], k=7)
    want = served.scorer.score(served.scorer.rows(new.tolist()))
    assert got.source == "scored" and [i for i, _ in got.items] == [
        f"new{i}" for i in np.argsort(-want, kind="stable")]


@pytest.mark.filterwarnings("ignore::solvers.ConvergenceWarning")
def test_a_model_from_an_svmlight_file_reads_dense_lists_in_its_numbering(tmp_path, redis_url):
    """Issue 51: features numbered from 1 in the training file were keyed 1.. by the model
    while a plain list was read from 0: the same document scored differently. The version
    records the numbering; a dense list of one value per feature is read 1.., the same as the
    file's {index: value} map, and a list one short is refused in one line."""
    events = synthetic.judgment_events(n_queries=40, docs_per_query=10, n_features=5, seed=3)
    lines = [f"{e['label']} qid:{e['query']} "
             + " ".join(f"{i + 1}:{v:g}" for i, v in enumerate(e["features"]))
             + f" # docid = {e['doc']}" for e in events]
    path = tmp_path / "letor.txt"
    path.write_text("\n".join(lines) + "\n")
    settings = Settings(home=tmp_path / "home", namespace=f"f{tmp_path.name[-10:]}")
    ingest_files([path], None, settings=settings, progress=False, fmt="svmlight")
    _, _, spec = CONFIGS["search"]
    run = retrain.run("search", {"search": parse_model("search", spec, "test")},
                      settings=settings, redis_url=redis_url)
    assert run["publish"]["published"], run.get("reason")
    docs = [[0.1, 0.9, 0.3, 0.0, 0.5], [0.8, 0.2, 0.4, 0.6, 0.1], [0.3, 0.3, 0.9, 0.2, 0.7]]
    with TopK(redis_url, namespace=settings.namespace) as topk:
        dense = topk.rank("search", [(f"d{i}", row) for i, row in enumerate(docs)], k=3)
        mapped = topk.rank("search", [(f"d{i}", {str(j + 1): v for j, v in enumerate(row)})
                                      for i, row in enumerate(docs)], k=3)
        assert dense.items == mapped.items
        with pytest.raises(ValueError, match=r"lists 4 features; the model numbers its 5 "
                                             r"features from 1 as its training file did"):
            topk.rank("search", [("short", docs[0][:4])], k=1)


@pytest.mark.filterwarnings("ignore::solvers.ConvergenceWarning")
def test_recommend_names_a_search_models_key_a_query(tmp_path, redis_url, capsys):
    """Issue 51: `rankstream recommend search 64` said "user '64'"."""
    from pipeline.cli import main

    kind, make, spec = CONFIGS["search"]
    events = make()
    settings = Settings(home=tmp_path / "home", namespace=f"q{tmp_path.name[-10:]}")
    ingest_files([synthetic.write_jsonl(events, tmp_path / "events.jsonl")], kind,
                 settings=settings, progress=False)
    retrain.run("search", {"search": parse_model("search", spec, "test")}, settings=settings,
                redis_url=redis_url)
    capsys.readouterr()
    assert main(["recommend", "search", str(events[0]["query"]), "--redis-url", redis_url,
                 "--namespace", settings.namespace]) == 0
    assert f", query {str(events[0]['query'])!r}: " in capsys.readouterr().out
