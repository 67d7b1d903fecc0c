"""The ``search`` model end to end over HTTP on LETOR 4.0 MQ2008 (issue 51): does a re-ranking
call to ``rankstream serve`` give the ranking quality of the model the gate published?

What runs, as a user runs it from the command line, all on loopback and under
``~/.local/state/rankstream/bench/search-http-<pid>`` (the rankstream HOME, the model config,
Redis's directory and the logs; removed at the end unless ``--keep``, kept after a failure):

1. a redis-server (``infra/redis/start.sh`` on a free port; stopped by pid at the end);
2. ``rankstream ingest --format svmlight`` of the fold's ``train.txt`` and ``vali.txt``
   (judgment events: the qid is the query, the ``docid`` comment the doc);
3. ``rankstream train search`` with the shipped ``dags/models.toml`` (copied into the state
   directory): kernel RankSVM, its gate (linear challenger, best single feature) and publish;
4. ``rankstream serve`` (``--server``, ``--workers``) on a free loopback port, stopped by pid;
5. for every query of the fold's ``test.txt``: one ``POST /v1/models/search/rank`` with all its
   candidate docs (each the 46 feature values as the file lists them, a dense list; ``k`` = the
   number of docs), timed from the client;
6. NDCG@10 (``solvers.metrics.query_ndcg``: LETOR's gain 2^label - 1 and discount, queries
   without a relevant doc counted as 0) of the HTTP order, and of the same docs scored in this
   process by the published artifact's scorer (read from the checkpoint the run committed, not
   from Redis), and the largest difference of a doc's score between the two;
7. a dense list one value short (45 of the 46 features) must be refused with a 4xx whose
   ``error`` is one line.

Targets: every test query answered (none refused, e.g. 400 "has no scorer"), |NDCG@10 over
HTTP - NDCG@10 in process| <= 0.01, and the short list refused in one line. Exit status: 0
every target met, 1 one missed or a step failed (one line on stderr), 2 the data is absent.

    .venv/bin/python bench/search_http.py [--fold 1] [--workers 1] [--keep]

About 2-5 minutes on 2 shared cores, most of it ``rankstream train search``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from serve_load import NAMESPACE, local_redis, serving  # noqa: E402

from pipeline.settings import state_dir  # noqa: E402

DATA = REPO.parent / "shared" / "data" / "letor4-mq2008"
MODEL = "search"
N_FEATURES = 46                 # every MQ2008 line lists features 1..46 (SOURCE.md)
NDCG_K = 10
TARGET_DIFF = 0.01              # |NDCG@10 over HTTP - in process|
NO_SCORER = "has no scorer"     # a version without a scorer refuses /rank with this 400
TRAIN_TIMEOUT_S = 3600


def say(t0: float, message: str) -> None:
    """One progress line on stderr (the results go to stdout)."""
    print(f"[{time.perf_counter() - t0:5.0f} s] {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------- data

def fold_file(data: Path, fold: int, split: str) -> Path | None:
    """``FoldN/split.txt``, or the ``.txt.gz`` that shared/data stores; None when neither."""
    for name in (f"{split}.txt", f"{split}.txt.gz"):
        path = data / f"Fold{fold}" / name
        if path.is_file():
            return path
    return None


@dataclass
class TestSet:
    """The fold's test file: one row per (query, doc), in file order."""

    query: np.ndarray           # qid per row
    label: np.ndarray           # relevance grade per row
    X: np.ndarray               # n x 46, feature j + 1 in column j, as the file lists them
    starts: np.ndarray = field(init=False)   # first row of each query (queries are contiguous)

    def __post_init__(self):
        self.starts = np.r_[np.flatnonzero(np.r_[True, self.query[1:] != self.query[:-1]]),
                            len(self.query)]

    def queries(self):
        """``(qid, rows)`` of each query, in file order."""
        for a, b in zip(self.starts[:-1], self.starts[1:]):
            yield str(self.query[a]), np.arange(a, b)


def load_test(path: Path) -> TestSet:
    from sklearn.datasets import load_svmlight_file

    X, y, q = load_svmlight_file(str(path), query_id=True, n_features=N_FEATURES)
    return TestSet(query=q, label=y.astype(np.int64), X=X.toarray())


# ---------------------------------------------------------------------- the CLI

def cli_env() -> dict:
    """This environment without the user's RANKSTREAM_* settings (the flags say where every
    piece is; a RANKSTREAM_STORE would otherwise send the events elsewhere)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RANKSTREAM_")}
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")    # idle OpenMP threads sleep: shared cores
    return env


def rankstream(root: Path, *args: str, ok=(0,), timeout: float = 600) -> str:
    """``rankstream ARGS`` (``python -m pipeline.cli``); its stdout. Both streams are appended
    to ``root/cli.log``; an exit status not in ``ok`` raises a one-line RuntimeError."""
    cmd = [sys.executable, "-m", "pipeline.cli", *args]
    out = subprocess.run(cmd, cwd=REPO, env=cli_env(), capture_output=True, text=True,
                         timeout=timeout)
    with open(root / "cli.log", "a") as log:
        log.write(f"$ rankstream {' '.join(args)}\n{out.stdout}{out.stderr}"
                  f"(exit {out.returncode})\n")
    if out.returncode not in ok:
        said = (out.stderr.strip().splitlines() or ["(nothing on stderr)"])[-1]
        raise RuntimeError(f"rankstream {args[0]} exited {out.returncode}: {said}")
    return out.stdout


def home_args(root: Path) -> list[str]:
    return ["--home", str(root / "home")]


def ingest(root: Path, files: list[Path]) -> dict:
    out = rankstream(root, "ingest", "--format", "svmlight", "--files", *map(str, files),
                     "--json", "--no-progress", *home_args(root))
    return json.loads(out.strip().splitlines()[-1])


def train(root: Path, redis_url: str) -> dict:
    """``rankstream train search --json``: the run's summary (exit 3, rejected, is a run)."""
    out = rankstream(root, "train", MODEL, "--json", "--no-progress", "--redis-url", redis_url,
                     "--namespace", NAMESPACE, "--config", str(root / "models.toml"),
                     *home_args(root), ok=(0, 3), timeout=TRAIN_TIMEOUT_S)
    return json.loads(out)


# ---------------------------------------------------------------------- HTTP

@dataclass
class HttpRun:
    """Every query's answer: a rank score per row (its HTTP position turned into n - p, so
    that the metric sees the server's order; 0 for rows no answer placed), the server's own
    score per row (NaN where absent), and per request its status, error and seconds."""

    order_score: np.ndarray
    served_score: np.ndarray
    status: list = field(default_factory=list)
    errors: list = field(default_factory=list)      # (qid, status, error) of refused queries
    seconds: list = field(default_factory=list)
    incomplete: int = 0                             # 200s that did not list every candidate


def candidates(test: TestSet, rows: np.ndarray) -> list[dict]:
    """The request's candidates: id = the row number in the test file (LETOR docids may
    repeat across queries), features = the row's 46 values as a dense list."""
    return [{"id": int(r), "features": test.X[r].tolist()} for r in rows]


def rank_every_query(client, test: TestSet) -> HttpRun:
    n = len(test.query)
    run = HttpRun(order_score=np.zeros(n), served_score=np.full(n, np.nan))
    for qid, rows in test.queries():
        body = {"candidates": candidates(test, rows), "k": len(rows), "query": qid}
        t = time.perf_counter()
        resp = client.post(f"/v1/models/{MODEL}/rank", json=body)
        run.seconds.append(time.perf_counter() - t)
        run.status.append(resp.status_code)
        if resp.status_code != 200:
            run.errors.append((qid, resp.status_code, response_error(resp)))
            continue
        items = resp.json()["items"]
        run.incomplete += len(items) != len(rows)
        for p, it in enumerate(items):
            run.order_score[int(it["item"])] = len(rows) - p
            run.served_score[int(it["item"])] = it["score"]
    return run


def response_error(resp) -> str:
    """The API's one-line error of a refused request (its body, when not JSON)."""
    try:
        return str(resp.json().get("error", resp.text))
    except ValueError:
        return resp.text


def short_list_refusal(client, test: TestSet) -> tuple[int, str]:
    """A candidate whose dense list is one value short of the model's 46 features: (status,
    error). Read as features 1..45 it would score every doc with shifted weights."""
    body = {"candidates": [{"id": 0, "features": test.X[0, :-1].tolist()}], "k": 1}
    resp = client.post(f"/v1/models/{MODEL}/rank", json=body)
    return resp.status_code, response_error(resp)


# ---------------------------------------------------------------------- in process

def published_artifact(summary: dict):
    """The artifact the run published, from the checkpoint it committed (``publish`` step:
    the gate's choice is moved to ``checkpoint/artifact``)."""
    from pipeline.serving.artifact import ModelArtifact

    pub = summary.get("publish") or {}
    if not pub.get("published"):
        raise RuntimeError(f"rankstream train {summary.get('model')} published nothing: "
                           f"{summary.get('decision')} - {summary.get('reason')}")
    return ModelArtifact.load(Path(pub["checkpoint"]) / "artifact")


def scores_in_process(artifact, test: TestSet) -> np.ndarray:
    """Every test doc scored by the artifact's scorer from the same dense lists, one query at a
    time as the server scores them."""
    scorer = artifact.scorer
    if scorer is None:
        raise RuntimeError(f"the published {MODEL} artifact ({artifact.served_as}) has no "
                           "scorer: /rank cannot score candidates")
    out = np.empty(len(test.query))
    for _, rows in test.queries():
        out[rows] = scorer.score(scorer.rows([test.X[r].tolist() for r in rows]))
    return out


# ---------------------------------------------------------------------- report

def ndcg(test: TestSet, scores: np.ndarray) -> float:
    from solvers.metrics import query_ndcg

    return query_ndcg(test.query, test.label, scores, k=NDCG_K, no_relevant="zero")


def counts(by_name: dict) -> str:
    return ", ".join(f"{n:,} {name}" for name, n in sorted(by_name.items())) or "0"


def feature_line(summary: dict, test: TestSet) -> str:
    """NDCG@10 on the test docs of the single feature (with its sign) the gate compared the
    model with: how much the model adds over one column."""
    found = ((summary.get("train") or {}).get("baselines") or {}).get("best_feature") or {}
    if "feature" not in found:
        return "NDCG@10 of one feature     n/a (the run chose no best feature)"
    j, sign = int(found["feature"]), float(found.get("sign", 1))
    value = ndcg(test, sign * test.X[:, j - 1])      # the file numbers features from 1
    return (f"NDCG@10 of one feature     {value:.4f}  (the gate's best_feature, feature {j} "
            f"sign {sign:+.0f}, on the same test docs)")


def train_line(s: dict) -> str:
    """The run in one line: what it decided and the gate's holdout numbers it decided on."""
    tr, gate, pub = s.get("train") or {}, s.get("gate") or {}, s.get("publish") or {}
    metric = gate.get("metric", "the metric")
    rivals = [("the model", (tr.get("metrics") or {}).get(metric))]
    if gate.get("challenger"):
        rivals.append((f"challenger {gate['challenger']}", gate.get("challenger_value")))
    rivals += [(f"trivial {n}", v) for n, v in (gate.get("trivial") or {}).items()]
    held = ", ".join(f"{n} {v:.4f}" for n, v in rivals if isinstance(v, float))
    return (f"train {s.get('model')}: decision {s.get('decision')}, version "
            f"{pub.get('version')}, the gate publishes {gate.get('publishes', '-')}; holdout "
            f"{metric}: {held or 'n/a'}; {s.get('seconds', 0):.1f} s")


def report(test: TestSet, run: HttpRun, local: np.ndarray, served: dict, refusal, wall: dict,
           artifact, summary: dict) -> list[tuple[str, bool]]:
    n_q = len(test.starts) - 1
    answered = sum(s == 200 for s in run.status)
    no_scorer = sum(NO_SCORER in e for _, _, e in run.errors)
    http_ndcg, local_ndcg = ndcg(test, run.order_score), ndcg(test, local)
    diff = abs(http_ndcg - local_ndcg)
    both = ~np.isnan(run.served_score)
    score_gap = float(np.max(np.abs(run.served_score[both] - local[both]))) if both.any() \
        else float("nan")
    ms = np.array(run.seconds) * 1e3
    rest = ms[1:] if len(ms) > 1 else ms
    print(f"test queries               {n_q} ({len(test.query):,} docs, "
          f"{int(np.sum(test.label > 0)):,} relevant)")
    print(f"answered                   {answered} of {n_q} (400 '{NO_SCORER}': {no_scorer}, "
          f"other refusals: {len(run.errors) - no_scorer}, 200 without every candidate: "
          f"{run.incomplete})")
    for qid, status, error in run.errors[:3]:
        print(f"  refused query {qid}: {status} {error}")
    print(f"NDCG@10 over HTTP          {http_ndcg:.4f}  (the server's order)")
    print(f"NDCG@10 in process         {local_ndcg:.4f}  (the published artifact's scorer, "
          f"version {served.get('version')}'s checkpoint)")
    print(f"|difference|               {diff:.4f}  (target <= {TARGET_DIFF})")
    print(feature_line(summary, test))
    print(f"max |score HTTP - local|   {score_gap:.3g} over {int(both.sum()):,} docs")
    print(f"served_as                  {served.get('served_as')} (version "
          f"{served.get('version')}, algorithm {served.get('algorithm')}; the checkpoint's "
          f"artifact says {artifact.served_as})")
    print(f"latency per request        first {ms[0]:.1f} ms; median {np.median(rest):.2f} ms, "
          f"p99 {np.percentile(rest, 99):.2f} ms over the other {len(rest)} "
          f"(mean {np.mean([len(r) for _, r in test.queries()]):.0f} candidates)")
    status, error = refusal
    one_line = "\n" not in error and bool(error)
    print(f"45 of 46 features, dense   {status} {error!r} (one line: "
          f"{'yes' if one_line else 'no'})")
    print("wall time                  " + ", ".join(f"{k} {v:.1f} s" for k, v in wall.items()))
    return [(f"every test query answered ({answered} of {n_q})", answered == n_q
             and not run.incomplete),
            (f"|NDCG@10 HTTP - in process| = {diff:.4f} <= {TARGET_DIFF}", diff <= TARGET_DIFF),
            (f"a dense list 1 short is refused with a one-line 4xx ({status})",
             400 <= status < 500 and one_line)]


# ---------------------------------------------------------------------- main

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fold", type=int, default=1, choices=range(1, 6), help="LETOR fold")
    ap.add_argument("--data", type=Path, default=DATA, help=f"default {DATA}")
    ap.add_argument("--server", choices=("granian", "uvicorn"), default="granian")
    ap.add_argument("--workers", type=int, default=1, help="server processes (default 1)")
    ap.add_argument("--keep", action="store_true", help="keep the state directory (logs)")
    args = ap.parse_args(argv)
    files = {s: fold_file(args.data, args.fold, s) for s in ("train", "vali", "test")}
    missing = [s for s, p in files.items() if p is None]
    if missing:
        print(f"search_http: no {', '.join(missing)} file of fold {args.fold} under "
              f"{args.data} (see {args.data / 'SOURCE.md'})", file=sys.stderr)
        return 2
    return run_targets("search_http", args.keep, lambda root, t0: run(args, files, root, t0))


def run_targets(name: str, keep: bool, run) -> int:
    """``run(root, t0)`` (its ``[(target, met)]``) in a state directory of its own, removed
    after a clean run unless ``keep``; prints each target; the exit status (1: one missed or
    a step failed, said in one line)."""
    t0 = time.perf_counter()
    root = state_dir("bench") / f"{name.replace('_', '-')}-{os.getpid()}"
    root.mkdir(mode=0o700)
    failed = True
    try:
        results = run(root, t0)
        failed = False
    except (RuntimeError, OSError, subprocess.SubprocessError, ValueError) as err:
        print(f"{name}: {err} (logs in {root})", file=sys.stderr)
        return 1
    finally:
        if keep or failed:
            print(f"(state kept in {root})", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)     # the directory made above, nothing else
    for target, met in results:
        print(f"target {target} : {'MET' if met else 'MISSED'}")
    return 0 if all(met for _, met in results) else 1


def run(args, files: dict, root: Path, t0: float) -> list[tuple[str, bool]]:
    import httpx

    shutil.copy(REPO / "dags" / "models.toml", root / "models.toml")
    wall = {}
    test = load_test(files["test"])
    with ExitStack() as stack:
        url = stack.enter_context(local_redis(root))
        say(t0, f"redis at {url}; ingesting {files['train'].name}, {files['vali'].name}")
        t = time.perf_counter()
        got = ingest(root, [files["train"], files["vali"]])
        wall["ingest"] = time.perf_counter() - t
        print(f"search_http: LETOR 4.0 MQ2008 fold {args.fold}; ingest "
              f"{files['train'].name} + {files['vali'].name}: {counts(got['events'])} events, "
              f"dead letters: {counts(got['dead_letters'])}")
        say(t0, f"rankstream train {MODEL} (the shipped dags/models.toml)")
        t = time.perf_counter()
        summary = train(root, url)
        wall["train"] = time.perf_counter() - t
        print(train_line(summary))
        artifact = published_artifact(summary)
        base, pid = stack.enter_context(serving(args.server, args.workers, url, root,
                                                root / "serve.log"))
        say(t0, f"rankstream serve ({args.server}, pid {pid}) at {base}; "
            f"{len(test.starts) - 1} queries")
        client = stack.enter_context(httpx.Client(base_url=base, timeout=60))
        served = client.get(f"/v1/models/{MODEL}").json()
        t = time.perf_counter()
        http = rank_every_query(client, test)
        wall["HTTP ranking"] = time.perf_counter() - t
        refusal = short_list_refusal(client, test)
    t = time.perf_counter()
    local = scores_in_process(artifact, test)
    wall["in process"] = time.perf_counter() - t
    say(t0, "done")
    return report(test, http, local, served, refusal, wall, artifact, summary)


if __name__ == "__main__":
    sys.exit(main())
