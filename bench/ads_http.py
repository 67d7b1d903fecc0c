"""The ``ads`` model end to end over HTTP on LIBSVM w8a (issue 51): do rows scored by
``rankstream serve`` rank the held-out outcomes as well as a plain logistic regression would?

What runs, as a user runs it from the command line, all on loopback and under
``~/.local/state/rankstream/bench/ads-http-<pid>`` (the rankstream HOME, the model config, the
training file, Redis's directory and the logs; removed at the end unless ``--keep``, kept after
a failure):

1. the split: w8a's 49,749 rows, 80% to train and 20% held out, stratified by label
   (``sklearn.model_selection.train_test_split(rows, test_size=0.2, stratify=labels,
   random_state=--seed)``, seed 0 by default), so both parts keep w8a's 2.97% positives;
   the training rows are written as a LIBSVM file, each line as w8a has it plus the comment
   ``# w8a-N`` (N: its line in w8a), which names the event's item;
2. a redis-server (``infra/redis/start.sh`` on a free port; stopped by pid at the end);
3. ``rankstream ingest --format svmlight --kind outcome`` of the training file (labels -1/+1
   stored as 0/1);
4. ``rankstream train ads`` with the shipped ``dags/models.toml`` (copied into the state
   directory): TopPush, its gate (the "logistic" challenger, best single feature) and publish.
   The pipeline holds out its own 20% of the events it is given to evaluate and gate on;
5. ``rankstream serve`` (``--server``, ``--workers``) on a free loopback port, stopped by pid;
6. the held-out rows in batches of ``--batch`` (at most 1,000, the API's bound) as
   ``POST /v1/models/ads/rank`` with ``k`` = the batch's size, so every row gets a score; each
   row's features as the sparse ``{index: value}`` map the file gives (w8a numbers from 1);
7. average precision (``solvers.metrics.average_precision``) of the HTTP scores against the
   held-out labels; the same rows scored in this process by the published artifact's scorer
   (read from the checkpoint the run committed, not from Redis); and scikit-learn's
   ``LogisticRegression(C=1)`` (default solver, lbfgs) fitted on the same 80% and scored on the
   same 20%; and, when the gate served something other than the model (its "logistic"
   challenger, say), the run's own TopPush model on the same rows (context, not a target).

Targets: every held-out row scored over HTTP, its scores equal to the in-process ones up to
float rounding (rtol 1e-6), and AP over HTTP / AP of scikit-learn >= 0.9. Exit status: 0 every
target met, 1 one missed or a step failed (one line on stderr), 2 the data is absent.

    .venv/bin/python bench/ads_http.py [--batch 500] [--seed 0] [--workers 1] [--keep]

About 1-3 minutes on 2 shared cores.
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import sys
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from search_http import (  # noqa: E402
    counts,
    home_args,
    published_artifact,
    rankstream,
    response_error,
    run_targets,
    say,
    train_line,
)
from serve_load import NAMESPACE, local_redis, serving  # noqa: E402

DATA = REPO.parent / "shared" / "data" / "libsvm-w8a" / "w8a.gz"
MODEL = "ads"
N_FEATURES = 300                # w8a's indices are 1..300 (SOURCE.md)
MAX_BATCH = 1000                # the most candidates one /rank takes (the API's MAX_K)
TARGET_RATIO = 0.9              # AP over HTTP / AP of scikit-learn's logistic regression
RTOL = 1e-6                     # "equal up to float rounding"
TRAIN_TIMEOUT_S = 3600


# ---------------------------------------------------------------------- data

@dataclass
class Rows:
    """w8a's rows in file order: the text before any comment, the 1-based line number in the
    file, the label (-1/+1 as 0/1) and the features as ``{index: value}``."""

    text: list
    line: np.ndarray
    y: np.ndarray
    features: list


def read_w8a(path: Path) -> Rows:
    text, line, y, features = [], [], [], []
    with gzip.open(path, "rt", encoding="ascii") as fh:
        for number, raw in enumerate(fh, start=1):
            data = raw.split("#", 1)[0].strip()
            if not data:
                continue                    # w8a ends with one blank line (SOURCE.md)
            label, *tokens = data.split()
            text.append(data)
            line.append(number)
            y.append(1 if int(label) > 0 else 0)
            features.append({int(i): float(v) for i, v in (t.split(":") for t in tokens)})
    return Rows(text, np.array(line), np.array(y, dtype=np.int8), features)


def split(rows: Rows, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Row positions (train, held out): 80/20, stratified by label, ``random_state=seed``."""
    from sklearn.model_selection import train_test_split

    train, test = train_test_split(np.arange(len(rows.y)), test_size=0.2, stratify=rows.y,
                                   random_state=seed)
    return np.sort(train), np.sort(test)


def write_training_file(rows: Rows, train: np.ndarray, path: Path) -> None:
    """The training rows as LIBSVM lines, each ``# w8a-N`` (its w8a line: the item id)."""
    with open(path, "w", encoding="ascii") as fh:
        for r in train:
            fh.write(f"{rows.text[r]} # w8a-{rows.line[r]}\n")


def csr(rows: Rows, at: np.ndarray):
    """The rows at ``at`` as a CSR matrix, feature i in column i - 1 (as sklearn reads w8a)."""
    import scipy.sparse as sp

    indptr, indices, values = [0], [], []
    for r in at:
        f = rows.features[r]
        indices += [i - 1 for i in f]
        values += list(f.values())
        indptr.append(len(indices))
    return sp.csr_matrix((values, indices, indptr), shape=(len(at), N_FEATURES))


# ---------------------------------------------------------------------- HTTP

@dataclass
class HttpScores:
    score: np.ndarray               # per held-out row; NaN where no answer gave one
    status: list
    errors: list                    # (batch, status, error) of refused batches
    seconds: list


def wire(rows: Rows, r: int) -> dict:
    """A row's features as JSON sends them: a map with the file's indices as keys."""
    return {str(i): v for i, v in rows.features[r].items()}


def score_over_http(client, rows: Rows, test: np.ndarray, batch: int) -> HttpScores:
    out = HttpScores(np.full(len(test), np.nan), [], [], [])
    for b, start in enumerate(range(0, len(test), batch)):
        part = range(start, min(start + batch, len(test)))
        body = {"candidates": [{"id": p, "features": wire(rows, test[p])} for p in part],
                "k": len(part)}
        t = time.perf_counter()
        resp = client.post(f"/v1/models/{MODEL}/rank", json=body)
        out.seconds.append(time.perf_counter() - t)
        out.status.append(resp.status_code)
        if resp.status_code != 200:
            out.errors.append((b, resp.status_code, response_error(resp)))
            continue
        for it in resp.json()["items"]:
            out.score[int(it["item"])] = it["score"]
    return out


def scores_in_process(artifact, rows: Rows, test: np.ndarray, batch: int) -> np.ndarray:
    """The held-out rows scored by the artifact's scorer from the same maps the requests
    carry, batch by batch as the server scores them."""
    scorer = artifact.scorer
    if scorer is None:
        raise RuntimeError(f"the published {MODEL} artifact ({artifact.served_as}) has no "
                           "scorer: /rank cannot score rows")
    out = np.empty(len(test))
    for start in range(0, len(test), batch):
        part = slice(start, min(start + batch, len(test)))
        out[part] = scorer.score(scorer.rows([wire(rows, r) for r in test[part]]))
    return out


def own_model_scores(summary: dict, rows: Rows, test: np.ndarray, batch: int):
    """The held-out rows scored by the run's own TopPush model (its artifact stays in the run
    directory when the gate serves something else), or None without one."""
    from pipeline.serving.artifact import ModelArtifact

    path = Path((summary.get("train") or {}).get("run_dir", "")) / "artifact"
    if not (path / "manifest.json").is_file():
        return None
    return scores_in_process(ModelArtifact.load(path), rows, test, batch)


def sklearn_scores(rows: Rows, train: np.ndarray, test: np.ndarray) -> tuple[np.ndarray, dict]:
    """LogisticRegression(C=1), default solver, on the training rows; held-out scores."""
    import warnings

    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression

    t = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConvergenceWarning)
        model = LogisticRegression(C=1.0, max_iter=10_000).fit(csr(rows, train), rows.y[train])
    info = {"seconds": time.perf_counter() - t, "n_iter": int(model.n_iter_[0]),
            "solver": model.solver, "converged": not caught}
    return model.decision_function(csr(rows, test)), info


# ---------------------------------------------------------------------- report

def report(rows: Rows, test: np.ndarray, http: HttpScores, local: np.ndarray, lr: np.ndarray,
           lr_info: dict, served: dict, artifact, wall: dict, batch: int,
           own: np.ndarray | None) -> list[tuple[str, bool]]:
    from solvers.metrics import average_precision

    y = rows.y[test]
    scored = ~np.isnan(http.score)
    ap_http = average_precision(y, np.where(scored, http.score, -np.inf)) if scored.any() \
        else float("nan")
    ap_local, ap_lr = average_precision(y, local), average_precision(y, lr)
    ratio = ap_http / ap_lr
    gap = float(np.max(np.abs(http.score[scored] - local[scored]))) if scored.any() else np.nan
    equal = bool(scored.all() and np.allclose(http.score, local, rtol=RTOL, atol=0.0))
    ms = np.array(http.seconds) * 1e3
    print(f"rows held out              {len(test):,} ({int(y.sum()):,} positives, "
          f"{y.mean():.2%}); {len(rows.y) - len(test):,} trained on")
    print(f"scored over HTTP           {int(scored.sum()):,} of {len(test):,} in "
          f"{len(http.status)} requests of {batch} (refused: {len(http.errors)})")
    for b, status, error in http.errors[:3]:
        print(f"  refused batch {b}: {status} {error}")
    print(f"AP over HTTP               {ap_http:.4f}")
    print(f"AP in process              {ap_local:.4f}  (the published artifact's scorer; max "
          f"|score HTTP - local| {gap:.3g})")
    print(f"AP sklearn                 {ap_lr:.4f}  (LogisticRegression C=1, {lr_info['solver']},"
          f" {lr_info['n_iter']} iterations{'' if lr_info['converged'] else ', NOT converged'})")
    print(f"ratio HTTP / sklearn       {ratio:.3f}  (target >= {TARGET_RATIO})")
    if own is not None and artifact.served_as != "model":
        ap_own = average_precision(y, own)
        print(f"AP of TopPush itself       {ap_own:.4f}  (the run's own model, not served; "
              f"ratio to sklearn {ap_own / ap_lr:.3f})")
    print(f"served_as                  {served.get('served_as')} (version "
          f"{served.get('version')}, algorithm {served.get('algorithm')}; the checkpoint's "
          f"artifact says {artifact.served_as})")
    print(f"latency per request        first {ms[0]:.1f} ms; median {np.median(ms):.1f} ms "
          f"over {len(ms)}")
    print("wall time                  " + ", ".join(f"{k} {v:.1f} s" for k, v in wall.items()))
    return [(f"every held-out row scored over HTTP ({int(scored.sum()):,} of {len(test):,})",
             bool(scored.all())),
            (f"HTTP scores = in-process scores up to float rounding (max |diff| {gap:.3g})",
             equal),
            (f"AP HTTP / AP sklearn = {ratio:.3f} >= {TARGET_RATIO}", ratio >= TARGET_RATIO)]


# ---------------------------------------------------------------------- main

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=DATA, help=f"default {DATA}")
    ap.add_argument("--seed", type=int, default=0, help="the split's random_state (default 0)")
    ap.add_argument("--batch", type=int, default=500,
                    help=f"rows per /rank request, 1..{MAX_BATCH} (default 500)")
    ap.add_argument("--server", choices=("granian", "uvicorn"), default="granian")
    ap.add_argument("--workers", type=int, default=1, help="server processes (default 1)")
    ap.add_argument("--keep", action="store_true", help="keep the state directory (logs)")
    args = ap.parse_args(argv)
    if not 1 <= args.batch <= MAX_BATCH:
        ap.error(f"--batch is {args.batch}, expected 1..{MAX_BATCH} (the API's bound on k)")
    if not args.data.is_file():
        print(f"ads_http: no w8a at {args.data} (see {args.data.parent / 'SOURCE.md'})",
              file=sys.stderr)
        return 2
    return run_targets("ads_http", args.keep, lambda root, t0: run(args, root, t0))


def run(args, root: Path, t0: float) -> list[tuple[str, bool]]:
    import httpx

    shutil.copy(REPO / "dags" / "models.toml", root / "models.toml")
    wall = {}
    rows = read_w8a(args.data)
    train, test = split(rows, args.seed)
    train_file = root / "w8a-train"
    write_training_file(rows, train, train_file)
    with ExitStack() as stack:
        url = stack.enter_context(local_redis(root))
        say(t0, f"redis at {url}; ingesting {len(train):,} rows as outcomes")
        t = time.perf_counter()
        got = rankstream(root, "ingest", "--format", "svmlight", "--kind", "outcome",
                         "--files", str(train_file), "--json", "--no-progress",
                         *home_args(root))
        wall["ingest"] = time.perf_counter() - t
        got = json.loads(got.strip().splitlines()[-1])
        print(f"ads_http: LIBSVM w8a ({len(rows.y):,} rows, {int(rows.y.sum()):,} positive), "
              f"80/20 stratified split, seed {args.seed}; ingest: {counts(got['events'])} "
              f"events, dead letters: {counts(got['dead_letters'])}")
        say(t0, f"rankstream train {MODEL} (the shipped dags/models.toml)")
        t = time.perf_counter()
        summary = json.loads(rankstream(
            root, "train", MODEL, "--json", "--no-progress", "--redis-url", url,
            "--namespace", NAMESPACE, "--config", str(root / "models.toml"), *home_args(root),
            ok=(0, 3), timeout=TRAIN_TIMEOUT_S))
        wall["train"] = time.perf_counter() - t
        print(train_line(summary))
        artifact = published_artifact(summary)
        base, pid = stack.enter_context(serving(args.server, args.workers, url, root,
                                                root / "serve.log"))
        say(t0, f"rankstream serve ({args.server}, pid {pid}) at {base}; {len(test):,} rows")
        client = stack.enter_context(httpx.Client(base_url=base, timeout=60))
        served = client.get(f"/v1/models/{MODEL}").json()
        t = time.perf_counter()
        http = score_over_http(client, rows, test, args.batch)
        wall["HTTP scoring"] = time.perf_counter() - t
    t = time.perf_counter()
    local = scores_in_process(artifact, rows, test, args.batch)
    wall["in process"] = time.perf_counter() - t
    own = own_model_scores(summary, rows, test, args.batch)
    say(t0, "scikit-learn LogisticRegression(C=1)")
    lr, lr_info = sklearn_scores(rows, train, test)
    wall["sklearn fit"] = lr_info["seconds"]
    say(t0, "done")
    return report(rows, test, http, local, lr, lr_info, served, artifact, wall, args.batch, own)


if __name__ == "__main__":
    sys.exit(main())
