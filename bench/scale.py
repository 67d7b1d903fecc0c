"""Implicit data through the product at the sizes users run (issue 50, item 6): per step wall
time and peak RSS, and the served quality against peers tuned in the same run.

Data sets (``--data``; files under ``$RANKSTREAM_DATA``, default ``../shared/data``):

* ``ml-1m-implicit``: MovieLens 1M ratings >= 3 (LightGCN++'s split), one line per user
  ``user item item ...``; 6,039 users, 3,628 items, 836k pairs;
* ``amazon-beauty``: Amazon Beauty 5-core (SELFRec's split), one line per interaction
  ``user item 1``; 52,204 users, 57,289 items, 395k pairs;
* ``synthetic-1m`` (40,000 users, 40,000 items) and ``synthetic-10m`` (200,000 users, 100,000
  items): implicit interactions drawn from a planted rank-32 taste model with Zipf item
  popularity (:func:`synthetic`), deterministic from ``--seed``, split 80/10/10 per (user, item)
  by a stable hash.

Protocol. Every data set has train, valid and test (user, item) pairs. train + valid are
written to a CSV of interaction events (``event_id,ts,kind,user,item``; ts increasing in file
order, the rows in a seeded random order) and ingested the way a user would:
``rankstream ingest --files events.csv`` (the CLI, as a child process; at 10M too). Then
``rankstream train movies`` runs the shipped ``movies`` config of ``dags/models.toml``,
unedited, against an embedded redis-server the bench started (it makes its own validation and
holdout split of what was ingested, tunes, fits, runs its ALS/EASE challengers and blends,
gates and publishes). A third child reads every test user's served top-20 with
``TopK.recommend`` (one call per user, timed: p50/p99) and once more with ``recommend_many``
in batches of 256 (users/s). Each step is a child process reaped with ``os.wait4``, so its
peak RSS (``ru_maxrss``) is its own; the children import the code of the tree this file is in
(``PYTHONPATH``), with ``RANKSTREAM_HOME`` and the XDG directories in a fresh temp directory
that the bench removes (``--keep`` keeps it). The solvers' kernels are compiled (or loaded
from numba's cache) once before the first step, as ``infra/setup.sh`` does, and that time is
printed apart: in a fresh checkout it was 40 s and 0.4 GB of the first ``train``.

Everyone is scored on test with full ranking: a user's candidates are all items minus their
train + valid items; over the users with at least one test item,

* Recall@20 = hits / |test items of the user| (LightGCN's convention, not min(20, |test|)),
* NDCG@20 with binary gains, IDCG over min(20, |test items|)

(:func:`bench._recsys.precision_recall_ndcg`). Scored: ``served`` (the lookups' lists), the
run's own artifacts when it left them (AltSVM's ``artifact/``, ``challenger-*``, ``blend-*``),
and the peers, fitted in this process on the same split: implicit's ALS (``GRID_ALS``, 16
settings, 15 iterations, chosen on valid Recall@20 with fits on train, refit on train + valid;
regularization up to 100: on ml-1m a grid that stopped at 1.0 chose its edge, 0.2676 against
0.2831 for the product's challenger at 100; 100 is still this grid's edge there, 0.2872),
an item-kNN (cosine with shrinkage, ``KNN_NEIGHBOURS`` x ``KNN_SHRINK``; each item keeps its k
most similar items; memory 12 bytes x items x 200 x 3 shrinkages for the candidate lists,
built over blocks of columns), EASE (only up to ``EASE_MAX_ITEMS`` items; λ from
``recommend_datasets.GRID_EASE``) and popularity (train + valid counts). A peer's fit seconds
are its final refit; its memory is the bench's peak RSS above the RSS at its start (sampled
every 20 ms).

Targets (issue 50): at 1M interactions (ml-1m, amazon-beauty, synthetic-1m) ``train movies``
<= 120 s and <= 2 GB peak RSS; at 10M <= 20 min and <= 8 GB; served Recall@20 >= 1.0x the
better of ALS and item-kNN; AltSVM's own >= 0.75x ALS.

``--warm`` holds back the newest ``WARM_SHARE`` (2%) of the ingested events: after the first
(cold) ``train movies`` they are ingested and ``train movies`` runs again, warm (the issue's
target: <= 0.3x the cold run), and the lookups read what that run served.

    PYTHONPATH=. .venv/bin/python bench/scale.py --data ml-1m-implicit [--max-users 500]
    PYTHONPATH=. .venv/bin/python bench/scale.py --data amazon-beauty --warm --skip-peers
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import scipy.sparse as sp

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(1, str(REPO / "bench"))
DATA = Path(os.environ.get("RANKSTREAM_DATA", REPO.parent / "shared" / "data"))
K = 20
MODEL = "movies"
BASE_TS = 1_700_000_000_000           # 2023-11-14 in epoch ms; event n is at BASE_TS + n
GRID_ALS = [{"factors": f, "regularization": r, "alpha": a}
            for f in (64, 128) for r in (0.1, 1.0, 10.0, 100.0) for a in (1.0, 10.0)]
ALS_ITERATIONS = 15
KNN_NEIGHBOURS = (50, 100, 200)
KNN_SHRINK = (0.0, 10.0, 100.0)
EASE_MAX_ITEMS = 20_000
WARM_SHARE = 0.02                     # --warm: the events the warm retrain adds
GB = 1e9
# (train movies seconds, peak RSS bytes) by size
TARGETS = {"1M": (120.0, 2 * GB), "10M": (1200.0, 8 * GB)}


@dataclass
class Split:
    """train / valid / test as binary CSR (users x items), 0-based ids of the source."""

    name: str
    train: sp.csr_matrix
    valid: sp.csr_matrix
    test: sp.csr_matrix
    size: str = "1M"                  # which targets apply

    @property
    def shape(self) -> tuple[int, int]:
        return self.train.shape

    def seen(self) -> sp.csr_matrix:
        """train + valid: what was ingested, and what no list may hold."""
        return _binary(self.train + self.valid)


def _binary(m) -> sp.csr_matrix:
    m = sp.csr_matrix(m, dtype=np.float32)
    m.sum_duplicates()
    m.data[:] = 1.0
    m.sort_indices()
    return m


# ----------------------------------------------------------------------------- data sets

def read_user_lists(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """``user item item ...`` per line -> (users, items)."""
    users, items = [], []
    with gzip.open(path, "rt") as fh:
        for line in fh:
            cells = line.split()
            if len(cells) > 1:
                users.append(np.full(len(cells) - 1, int(cells[0]), np.int64))
                items.append(np.array(cells[1:], np.int64))
    return np.concatenate(users), np.concatenate(items)


def read_triples(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """``user item 1`` per line -> (users, items)."""
    cells = np.loadtxt(gzip.open(path, "rt"), dtype=np.int64, usecols=(0, 1), ndmin=2)
    return cells[:, 0], cells[:, 1]


def from_folder(name: str, folder: Path, reader) -> Split:
    parts = [reader(folder / f"{part}.txt.gz") for part in ("train", "valid", "test")]
    return compact(name, parts)


def compact(name: str, parts, size: str = "1M") -> Split:
    """Users and items renumbered 0.. over the three parts (the same order as the source)."""
    users = np.unique(np.concatenate([u for u, _ in parts]))
    items = np.unique(np.concatenate([i for _, i in parts]))
    shape = (len(users), len(items))
    mats = [_binary(sp.coo_matrix((np.ones(len(u), np.float32),
                                   (np.searchsorted(users, u), np.searchsorted(items, i))),
                                  shape=shape)) for u, i in parts]
    return Split(name, *mats, size=size)


def subsample(split: Split, max_users: int, seed: int) -> Split:
    """``max_users`` users drawn with ``seed``, their items renumbered (a smoke run)."""
    if max_users >= split.shape[0]:
        return split
    keep = np.sort(np.random.default_rng(seed).choice(split.shape[0], max_users, replace=False))
    parts = []
    for m in (split.train, split.valid, split.test):
        coo = m[keep].tocoo()
        parts.append((coo.row.astype(np.int64), coo.col.astype(np.int64)))
    return compact(f"{split.name} ({max_users} users)", parts, split.size)


def _mix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finalizer: a stable hash of uint64 keys."""
    x = x.astype(np.uint64)
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def synthetic(n_users: int, n_items: int, per_user: float, seed: int, *, topics: int = 32,
              size: str = "1M") -> Split:
    """Implicit interactions of a planted low-rank taste model with Zipf popularity.

    Item i has popularity 1 / r_i (its Zipf rank r_i, a random order) and, per topic t, a taste
    weight exp(1.5 z_ti), z ~ N(0, 1); user u mixes the topics with θ_u ~ Dirichlet(0.1): u
    meets item i with probability Σ_t θ_ut φ_ti, φ_t ∝ popularity x taste_t (a rank-32
    matrix). A user wants n_u ~ lognormal items (mean ``per_user``, at least 5), drawn with
    replacement in up to four rounds until n_u distinct ones (a few heavy users of popular
    topics end with fewer). Each (user, item) goes to train / valid / test with probability
    0.8 / 0.1 / 0.1 by a stable hash of the pair and ``seed``.
    """
    rng = np.random.default_rng(seed)
    popularity = (1.0 / np.arange(1, n_items + 1))[rng.permutation(n_items)]
    phi = popularity * np.exp(1.5 * rng.standard_normal((topics, n_items)))
    cdf = np.cumsum(phi, axis=1)
    cdf /= cdf[:, -1:]
    mix = np.cumsum(rng.dirichlet(np.full(topics, 0.1), n_users), axis=1)
    want = np.clip(np.round(rng.lognormal(np.log(per_user) - 0.5, 1.0, n_users)), 5,
                   n_items // 20).astype(np.int64)
    keys = np.zeros(0, np.int64)
    need = want
    for _ in range(4):
        users = np.repeat(np.arange(n_users), need)
        topic = np.empty(len(users), np.int64)
        for start in range(0, len(users), 1 << 20):
            u = users[start:start + (1 << 20)]
            r = rng.random(len(u))
            topic[start:start + len(u)] = np.minimum((mix[u] < r[:, None]).sum(axis=1),
                                                     topics - 1)
        items = np.empty(len(users), np.int64)
        draw = rng.random(len(users))
        for t in range(topics):
            at = topic == t
            items[at] = np.searchsorted(cdf[t], draw[at], side="right")
        np.minimum(items, n_items - 1, out=items)
        keys = np.unique(np.concatenate([keys, users * n_items + items]))
        need = np.maximum(want - np.bincount(keys // n_items, minlength=n_users), 0)
        if not need.any():
            break
    u = _mix64(keys.astype(np.uint64) ^ np.uint64(seed * 0x9E3779B97F4A7C15 % 2**64))
    where = (u >> np.uint64(11)).astype(np.float64) / 2.0**53
    parts = [(keys[m] // n_items, keys[m] % n_items)
             for m in (where < 0.8, (where >= 0.8) & (where < 0.9), where >= 0.9)]
    return compact(f"synthetic {n_users:,} x {n_items:,}", parts, size)


def load(name: str, seed: int) -> Split | None:
    """The named data set, or None (said on the console) where its folder is absent."""
    if name.startswith("synthetic-"):
        n_users, n_items, per_user, size = SYNTHETIC[name]
        t = time.perf_counter()
        split = synthetic(n_users, n_items, per_user, seed, size=size)
        split.name = name
        print(f"{name}: generated in {time.perf_counter() - t:.1f} s")
        return split
    folder = DATA / FOLDERS[name][0]
    if not folder.is_dir():
        print(f"{name}: {folder} is absent (set RANKSTREAM_DATA); skipped")
        return None
    return from_folder(name, folder, FOLDERS[name][1])


FOLDERS = {"ml-1m-implicit": ("ml-1m-implicit", read_user_lists),
           "amazon-beauty": ("amazon-beauty", read_triples)}
SYNTHETIC = {"synthetic-1m": (40_000, 40_000, 25.0, "1M"),
             "synthetic-10m": (200_000, 100_000, 50.0, "10M")}
CHOICES = (*FOLDERS, *SYNTHETIC)


def write_events(split: Split, path: Path, seed: int, later: Path | None = None) -> int:
    """train + valid as a CSV of interaction events, rows in a seeded random order, ts
    increasing in file order; returns the number of events. With ``later``, the newest
    ``WARM_SHARE`` of them go there instead (the events a warm retrain adds)."""
    coo = split.seen().tocoo()
    order = np.random.default_rng(seed).permutation(coo.nnz)
    users, items = coo.row[order], coo.col[order]
    first = coo.nnz if later is None else coo.nnz - int(round(WARM_SHARE * coo.nnz))
    for target, lo, hi in ((path, 0, first), (later, first, coo.nnz)):
        if target is None:
            continue
        with open(target, "w") as fh:
            fh.write("event_id,ts,kind,user,item\n")
            for start in range(lo, hi, 500_000):
                stop = min(start + 500_000, hi)
                fh.write("".join(f"e{n},{BASE_TS + n},interaction,{u},{i}\n" for n, u, i in zip(
                    range(start, stop), users[start:stop].tolist(),
                    items[start:stop].tolist())))
    return coo.nnz


# ----------------------------------------------------------------------------- steps

def _rss_now(pid: int | str = "self") -> int:
    """Resident set size in bytes (0 when the process is gone)."""
    try:
        with open(f"/proc/{pid}/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, IndexError, ValueError):
        return 0


def run_step(label: str, cmd: list[str], env: dict, logs: Path) -> dict:
    """Run ``cmd`` as a child; wall seconds, its own peak RSS (``os.wait4``'s ru_maxrss),
    exit code and output. A line a minute while it runs."""
    out, err = logs / f"{label}.out", logs / f"{label}.err"
    start = time.perf_counter()
    note = start + 60.0
    with open(out, "wb") as fo, open(err, "wb") as fe:
        proc = subprocess.Popen(cmd, stdout=fo, stderr=fe, env=env, cwd=logs)
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() >= note:
                print(f"     {label}: {note - start:.0f} s, RSS {_rss_now(proc.pid) / GB:.2f} GB",
                      flush=True)
                note += 60.0
            time.sleep(0.05)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    return {"wall": wall, "peak_rss": usage.ru_maxrss * 1024, "rc": proc.returncode,
            "stdout": out.read_text(errors="replace"), "stderr": err.read_text(errors="replace")}


def child_env(tmp: Path, home: Path) -> dict:
    """The environment of every child: this tree's code first, a fresh HOME and XDG dirs,
    no RANKSTREAM_* setting of the caller's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RANKSTREAM_")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [os.environ.get(
        "PYTHONPATH")])])
    env["RANKSTREAM_HOME"] = str(home)
    for var in ("XDG_DATA_HOME", "XDG_STATE_HOME", "XDG_CACHE_HOME"):
        env[var] = str(tmp / "xdg" / var.split("_")[1].lower())
    return env


def cli(*args: str) -> list[str]:
    """``rankstream ARGS`` (the console script's entry point) with this interpreter."""
    return [sys.executable, "-m", "pipeline.cli", *args]


def lookups_child(url: str, users_path: str, out_path: str) -> int:
    """The lookups step (run as a child by :func:`product`): every user's served top-K, one
    timed ``recommend`` each, then ``recommend_many`` in batches of 256; writes ``out_path``
    (.npz) and prints a JSON summary."""
    from pipeline.serving.lookup import TopK

    users = [str(u) for u in np.load(users_path)]
    items = np.full((len(users), K), -1, np.int64)
    took = np.zeros(len(users))
    sources: dict = {}
    with TopK(url, timeout=2.0) as topk:
        if users:
            topk.recommend(MODEL, users[0], k=K)          # loads the version's description
        for n, user in enumerate(users):
            t = time.perf_counter()
            rec = topk.recommend(MODEL, user, k=K)
            took[n] = time.perf_counter() - t
            got = [int(i) for i, _ in rec.items[:K]]
            items[n, :len(got)] = got
            sources[rec.source] = sources.get(rec.source, 0) + 1
        t = time.perf_counter()
        same = 0
        for start in range(0, len(users), 256):
            batch = topk.recommend_many(MODEL, users[start:start + 256], k=K)
            same += sum([int(i) for i, _ in r.items[:K]] == [x for x in items[start + j] if x >= 0]
                        for j, r in enumerate(batch))
        batch_seconds = time.perf_counter() - t
    np.savez(out_path, items=items, seconds=took)
    print(json.dumps({"sources": sources, "batch_seconds": batch_seconds,
                      "batch_same": same, "users": len(users)}))
    return 0


def product(split: Split, tmp: Path, events: Path, repeat: int,
            later: Path | None = None) -> dict:
    """ingest, ``train movies`` and lookups through the product, each step a child; with
    ``later`` (``--warm``), then ingest it and ``train movies`` again, warm (the run reuses
    the last one's checkpoint and choices), before the lookups."""
    from pipeline.serving.embedded_redis import EmbeddedRedis

    home = tmp / f"home-{repeat}"
    logs = tmp / f"logs-{repeat}"
    home.mkdir()
    logs.mkdir()
    env = child_env(tmp, home)
    steps = {"ingest": run_step("ingest", cli("ingest", "--files", str(events), "--format",
                                              "csv", "--home", str(home), "--no-progress",
                                              "--json"), env, logs)}
    out = {"steps": steps, "home": home}
    if steps["ingest"]["rc"]:
        return out
    test_users = np.flatnonzero(np.diff(split.test.indptr) > 0)
    np.save(logs / "users.npy", test_users)
    with EmbeddedRedis() as server:
        steps["train movies"] = run_step(
            "train", cli("train", MODEL, "--config", str(REPO / "dags" / "models.toml"),
                         "--home", str(home), "--redis-url", server.url, "--json"), env, logs)
        try:
            out["summary"] = json.loads(steps["train movies"]["stdout"])
        except ValueError:
            return out
        if not (out["summary"].get("publish") or {}).get("published"):
            return out
        if later is not None:
            steps["ingest later"] = run_step("ingest", cli(
                "ingest", "--files", str(later), "--format", "csv", "--home", str(home),
                "--no-progress", "--json"), env, logs)
            steps["warm train"] = run_step(
                "train", cli("train", MODEL, "--config", str(REPO / "dags" / "models.toml"),
                             "--home", str(home), "--redis-url", server.url, "--json"), env,
                logs)
            try:
                out["cold summary"], out["summary"] = out["summary"], json.loads(
                    steps["warm train"]["stdout"])
            except ValueError:
                return out
        steps["lookups"] = run_step("lookups", [sys.executable, str(Path(__file__).resolve()),
                                                "--lookups-child", server.url,
                                                str(logs / "users.npy"),
                                                str(logs / "lookups.npz")], env, logs)
        out["redis_rss"] = _redis_hwm(server.pid)
    if steps["lookups"]["rc"] == 0:
        got = np.load(logs / "lookups.npz")
        out["served"] = (test_users, got["items"])
        out["lookup_seconds"] = got["seconds"]
        out["lookup_info"] = json.loads(steps["lookups"]["stdout"].strip().splitlines()[-1])
    return out


def _redis_hwm(pid) -> int:
    """redis-server's peak RSS (VmHWM) in bytes, 0 if unknown."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


# ----------------------------------------------------------------------------- scoring

def scores_of(top: np.ndarray, positives: sp.csr_matrix, users: np.ndarray) -> dict:
    """Mean Recall@K and NDCG@K of ``top`` (rows = ``users``, our item ids, -1 = none)."""
    from _recsys import precision_recall_ndcg

    m = precision_recall_ndcg(top, positives, users)
    return {"recall": float(m["recall"].mean()), "ndcg": float(m["ndcg"].mean()),
            "users": int(m["users"].size)}


def factor_topk(U, V, bias, seen: sp.csr_matrix, users: np.ndarray) -> np.ndarray:
    """Top-K of ``U[users] @ V.T + bias`` over each user's unseen items (the product's own
    top-K, :func:`solvers.topk.user_topk`)."""
    from solvers.topk import user_topk

    rows, U = seen[users], U[users]
    return user_topk(U if sp.issparse(U) else np.ascontiguousarray(U, np.float32), V, K,
                     item_bias=bias, seen_indptr=rows.indptr, seen_indices=rows.indices)[0]


def item_topk(X: sp.csr_matrix, W, seen: sp.csr_matrix, users: np.ndarray) -> np.ndarray:
    """Top-K of ``X[users] @ W`` (W sparse or dense, items x items) over unseen items, in
    blocks of users (dense scores of about 2e7 at a time; ties by lower item index)."""
    from _recsys import topk_unseen

    block = max(64, int(2e7 // max(X.shape[1], 1)))
    out = np.empty((len(users), K), np.int64)
    for start in range(0, len(users), block):
        u = users[start:start + block]
        s = X[u] @ W
        s = s.toarray() if sp.issparse(s) else np.asarray(s)
        out[start:start + len(u)] = topk_unseen(s.astype(np.float32, copy=False), seen, K, u)
    return out


class PeakRSS:
    """This process's peak RSS above its RSS at entry, sampled every 20 ms (``delta``)."""

    def __enter__(self):
        self.start = self.peak = _rss_now()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()
        self.t = time.perf_counter()
        return self

    def _watch(self):
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, _rss_now())

    def __exit__(self, *exc):
        self.seconds = time.perf_counter() - self.t
        self._stop.set()
        self._thread.join()
        self.delta = max(self.peak, _rss_now()) - self.start


def _users_with(m: sp.csr_matrix) -> np.ndarray:
    return np.flatnonzero(np.diff(m.indptr) > 0)


def tune(name: str, grid: list, fit, topk, split: Split) -> dict:
    """Fit each setting on train, score its valid Recall@K (train items excluded), refit the
    best on train + valid; the final model's test lists and costs."""
    users_v = _users_with(split.valid)
    t = time.perf_counter()
    scored = []
    for params in grid:
        model = fit(split.train, params)
        scored.append(scores_of(topk(model, split.train, split.train, users_v), split.valid,
                                users_v)["recall"])
        print(f"     {name} {params}: valid Recall@{K} {scored[-1]:.4f}", flush=True)
    tuning = time.perf_counter() - t
    best = grid[int(np.argmax(scored))]
    seen = split.seen()
    users_t = _users_with(split.test)
    with PeakRSS() as mem:
        model = fit(seen, best)
    top = topk(model, seen, seen, users_t)
    return {"top": top, "users": users_t, "chosen": best, "valid": max(scored),
            "fit_seconds": mem.seconds, "rss_delta": mem.delta, "tuning_seconds": tuning}


def als_fit(X: sp.csr_matrix, params: dict):
    from implicit.cpu.als import AlternatingLeastSquares
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1, "blas"):       # implicit's advice: its threads, one BLAS thread
        als = AlternatingLeastSquares(factors=params["factors"],
                                      regularization=params["regularization"],
                                      alpha=params["alpha"], iterations=ALS_ITERATIONS,
                                      random_state=0)
        als.fit(X, show_progress=False)
    return np.asarray(als.user_factors, np.float32), np.asarray(als.item_factors, np.float32)


def knn_peer(split: Split) -> dict:
    """Item-kNN tuned on valid over ``KNN_NEIGHBOURS`` x ``KNN_SHRINK`` (one candidate build
    per data: the largest k, every shrinkage; :mod:`solvers.neighbours`, the product's own
    challenger's code, here tuned on the split's valid part by a plain grid), refit on train
    + valid."""
    from solvers.neighbours import cosine_neighbours, neighbour_rows

    cache = {}

    def fit(X, params):
        key = id(X)
        if key not in cache:
            cache.clear()
            cache[key] = cosine_neighbours(X, KNN_SHRINK, max(KNN_NEIGHBOURS))
        V = neighbour_rows(cache[key][params["shrink"]], X.shape[1], params["k"])
        return X, V.T.tocsr()          # W: column j holds j's neighbours

    grid = [{"k": k, "shrink": s} for k in KNN_NEIGHBOURS for s in KNN_SHRINK]
    return tune("item-kNN", grid, fit, lambda m, X, seen, users: item_topk(m[0], m[1], seen,
                                                                            users), split)


def ease_peer(split: Split) -> dict:
    """EASE (Steck 2019): B = I - P diagMat(1 / diag P), P = (X'X + λI)^-1 (float32), λ
    from ``GRID_EASE`` on valid."""
    from recommend_datasets import GRID_EASE
    from scipy.linalg import inv

    def fit(X, params):
        G = (X.T @ X).toarray().astype(np.float32)
        G[np.diag_indices_from(G)] += params["lambda"]
        P = inv(G, overwrite_a=True, check_finite=False)
        B = P / -np.diag(P)
        B[np.diag_indices_from(B)] = 0.0
        return X, B

    return tune("EASE", [{"lambda": lam} for lam in GRID_EASE], fit,
                lambda m, X, seen, users: item_topk(m[0], m[1], seen, users), split)


def als_peer(split: Split) -> dict:
    return tune("ALS", GRID_ALS, als_fit,
                lambda m, X, seen, users: factor_topk(m[0], m[1], None, seen, users), split)


def popularity(split: Split) -> dict:
    seen = split.seen()
    users = _users_with(split.test)
    counts = np.asarray(seen.sum(axis=0), np.float32).ravel()
    ones = np.ones((split.shape[0], 1), np.float32)
    return {"top": factor_topk(ones, counts[:, None], None, seen, users), "users": users}


def run_artifacts(summary: dict, split: Split) -> dict:
    """Test lists of the run's own artifacts: AltSVM's, each challenger's, the blend's (a
    published one is in the checkpoint)."""
    from pipeline.serving.artifact import ModelArtifact

    run_dir = Path(summary["dataset"]["run_dir"])
    published = summary["gate"].get("publishes") if summary.get("publish", {}).get(
        "published") else None
    where = {"AltSVM (own)": "artifact"}
    for d in sorted(run_dir.glob("challenger-*")) + sorted(run_dir.glob("blend-*")):
        where[f"{d.name} (run's)"] = d.name
    if published and published.startswith(("challenger-", "blend-")):
        where.setdefault(f"{published} (run's)", published)
    seen = split.seen()
    users = _users_with(split.test)
    out = {}
    for label, name in where.items():
        d = run_dir / name
        if not d.is_dir() and published == ("model" if name == "artifact" else name):
            d = Path(summary["publish"]["checkpoint"]) / "artifact"
        if not d.is_dir():
            continue
        art = ModelArtifact.load(d)
        if art.kind != "user_item":
            continue
        ids = art.item_ids.astype(np.int64)
        to_art = np.full(split.shape[1], -1, np.int64)
        to_art[ids] = np.arange(len(ids))
        row_of = np.full(split.shape[0], -1, np.int64)
        row_of[art.key_ids.astype(np.int64)] = np.arange(len(art.key_ids))
        known = users[row_of[users] >= 0]
        s = seen[known].tocoo()
        col = to_art[s.col]
        mine = sp.csr_matrix((np.ones(int((col >= 0).sum()), np.float32),
                              (s.row[col >= 0], col[col >= 0])), shape=(len(known), len(ids)))
        top_art = factor_topk(art.user_factors[row_of[known]], art.item_factors, art.item_bias,
                              mine, np.arange(len(known)))
        top = np.full((len(users), K), -1, np.int64)
        top[np.isin(users, known)] = np.where(top_art >= 0, ids[top_art], -1)
        out[label] = {"top": top, "users": users}
    return out


# ----------------------------------------------------------------------------- reporting

def _pct(a, q) -> float:
    return float(np.percentile(a, q)) if len(a) else float("nan")


def report_run(split: Split, n_events: int, runs: list[dict]) -> None:
    for n, run in enumerate(runs):
        print(f"   repeat {n + 1}: {'step':<14} {'wall s':>8} {'peak RSS GB':>12}")
        for label, st in run["steps"].items():
            extra = "" if st["rc"] == 0 else f"  exit {st['rc']}: {st['stderr'][-600:]!r}"
            print(f"             {label:<14} {st['wall']:>8.1f} {st['peak_rss'] / GB:>12.2f}"
                  f"{extra}")
        if run.get("redis_rss"):
            print(f"             {'redis-server':<14} {'':>8} {run['redis_rss'] / GB:>12.2f}")
        if "steps" in run and run["steps"]["ingest"]["rc"] == 0:
            info = json.loads(run["steps"]["ingest"]["stdout"].strip().splitlines()[-1])
            print(f"     ingest: {info['events']} events, dead letters {info['dead_letters']}, "
                  f"{n_events / run['steps']['ingest']['wall']:,.0f} events/s of wall time")
        if "warm train" in run["steps"]:
            ratio = run["steps"]["warm train"]["wall"] / run["steps"]["train movies"]["wall"]
            print(f"     warm retrain after {WARM_SHARE:.0%} more events: "
                  f"{run['steps']['warm train']['wall']:.1f} s = {ratio:.2f}x the cold one "
                  f"(<= 0.3x: {_mark(ratio <= 0.3)}), decision "
                  f"{run['summary'].get('decision')}")
        if "lookup_seconds" in run:
            s, info = run["lookup_seconds"] * 1e6, run["lookup_info"]
            print(f"     lookups: {info['users']:,} users, recommend p50 {_pct(s, 50):.0f} µs, "
                  f"p99 {_pct(s, 99):.0f} µs, max {s.max():.0f} µs; recommend_many (256) "
                  f"{info['users'] / info['batch_seconds']:,.0f} users/s, "
                  f"{info['batch_same']:,} answers the same; sources {info['sources']}")
    s = runs[-1].get("summary")
    if not s:
        return
    tr = s.get("train") or {}
    tuning = tr.get("tuning") or {}
    ch = tr.get("challenger") or {}
    print(f"     run: dataset {s['dataset'].get('dataset_seconds', 0):.1f} s "
          f"({s['dataset']['stats'].get('comparisons', 0):,} comparisons); AltSVM tuning "
          f"{tuning.get('seconds', 0):.1f} s ({len(tuning.get('tried', []))} settings, "
          f"{tuning.get('source')}, chose {tuning.get('choice')}), fit in all "
          f"{tr.get('fit_seconds', 0):.1f} s (refit {tr.get('refit_seconds', 0):.1f} s)")
    for c in ([ch, *ch.get("others", [])] if ch else []):
        cost = c.get("skipped") or f"{c.get('fit_seconds', 0):.1f} s"
        chosen = next((t["chosen"] for t in c.get("tried", []) if "chosen" in t), None)
        print(f"     challenger {c['name']}: {cost}, chose {chosen}")
    if ch.get("blend"):
        print(f"     blend {ch['blend'].get('name')} weight {ch['blend'].get('weight')}")
    gate = s.get("gate") or {}
    value = gate.get("value") or float("nan")
    print(f"     gate: {s.get('decision')}, serves {gate.get('publishes')} "
          f"({gate.get('metric')} {value:.4f}); run {s['seconds']:.1f} s in its summary; "
          f"{str(s.get('reason'))[:300]}")


def report_quality(name: str, lists: dict, positives, peers_info: dict) -> dict:
    scores = {label: scores_of(v["top"], positives, v["users"]) for label, v in lists.items()}
    print(f"   {'lists':<28} {'Recall@20':>9} {'NDCG@20':>8}  {'fit s':>7} {'ΔRSS GB':>8}  "
          "chosen")
    for label, m in scores.items():
        info = peers_info.get(label, {})
        fit = f"{info['fit_seconds']:>7.1f}" if "fit_seconds" in info else f"{'':>7}"
        mem = f"{info['rss_delta'] / GB:>8.2f}" if "rss_delta" in info else f"{'':>8}"
        chosen = (f"{info['chosen']} (valid {info['valid']:.4f}, tuning "
                  f"{info['tuning_seconds']:.0f} s)" if "chosen" in info else "")
        print(f"   {label:<28} {m['recall']:>9.4f} {m['ndcg']:>8.4f}  {fit} {mem}  {chosen}")
    return scores


def ratios(scores: dict) -> dict:
    out = {}
    served = scores.get("served")
    peers = [p for p in ("ALS (grid)", "item-kNN (grid)") if p in scores]
    for metric in ("recall", "ndcg"):
        if served and peers:
            best = max(peers, key=lambda p: scores[p][metric])
            out[f"served/best {metric}"] = (served[metric] / scores[best][metric], best)
            every = [p for p in scores if p.endswith("(grid)")]
            best = max(every, key=lambda p: scores[p][metric])
            out[f"served/best any {metric}"] = (served[metric] / scores[best][metric], best)
        if served and "popularity" in scores:
            out[f"served/popularity {metric}"] = served[metric] / scores["popularity"][metric]
        if "AltSVM (own)" in scores and "ALS (grid)" in scores:
            out[f"AltSVM/ALS {metric}"] = (scores["AltSVM (own)"][metric]
                                           / scores["ALS (grid)"][metric])
    for key, value in out.items():
        shown = f"{value[0]:.3f} ({value[1]})" if isinstance(value, tuple) else f"{value:.3f}"
        print(f"   {key:<26} {shown}")
    return out


def _mark(ok: bool) -> str:
    return "met" if ok else "MISSED"


def summary_line(split: Split, runs: list[dict], r: dict) -> str:
    trains = [run["steps"]["train movies"] for run in runs if "train movies" in run["steps"]]
    if not trains:
        return f"{split.name}: no `train movies` step ran"
    wall = float(np.median([t["wall"] for t in trains]))
    rss = max(t["peak_rss"] for t in trains)
    max_s, max_rss = TARGETS[split.size]
    line = (f"{split.name}: `train movies` {wall:.1f} s (<= {max_s:.0f}: {_mark(wall <= max_s)}),"
            f" peak RSS {rss / GB:.2f} GB (<= {max_rss / GB:.0f}: {_mark(rss <= max_rss)})")
    if "served/best recall" in r:
        v, best = r["served/best recall"]
        line += f", served/{best} Recall@20 {v:.3f} (>= 1.0: {_mark(v >= 1.0)})"
    if "AltSVM/ALS recall" in r:
        v = r["AltSVM/ALS recall"]
        line += f", AltSVM own/ALS {v:.3f} (>= 0.75: {_mark(v >= 0.75)})"
    return line


# ----------------------------------------------------------------------------- main

def run_set(split: Split, args, tmp: Path) -> str:
    seen = split.seen()
    tv_test = split.test.multiply(seen).nnz
    print(f"\n== {split.name}: {split.shape[0]:,} users, {split.shape[1]:,} items; train "
          f"{split.train.nnz:,} + valid {split.valid.nnz:,} = {seen.nnz:,} interactions "
          f"ingested; test {split.test.nnz:,} pairs ({tv_test} also in train/valid), "
          f"{len(_users_with(split.test)):,} users scored; targets of {split.size}", flush=True)
    events = tmp / "events.csv"
    later = tmp / "later.csv" if args.warm else None
    t = time.perf_counter()
    n_events = write_events(split, events, args.seed, later)
    print(f"   events.csv: {n_events:,} rows, {events.stat().st_size / 1e6:.0f} MB written in "
          f"{time.perf_counter() - t:.1f} s", flush=True)
    runs = []
    for repeat in range(args.repeats):
        runs.append(product(split, tmp, events, repeat, later))
        for label, st in runs[-1]["steps"].items():
            print(f"   {label}: {st['wall']:.1f} s, peak RSS {st['peak_rss'] / GB:.2f} GB, "
                  f"exit {st['rc']}", flush=True)
    events.unlink()
    if later is not None:
        later.unlink()
    report_run(split, n_events, runs)
    lists, info = {}, {}
    last = runs[-1]
    if "served" in last:
        users, items = last["served"]
        leaked = int(sum(seen[u, i[i >= 0]].nnz for u, i in zip(users, items)))
        short = int((items < 0).any(axis=1).sum())
        print(f"   served lists: {leaked} items met in train/valid, {short} lists under {K}")
        label = f"served ({last['summary']['gate'].get('publishes')})"
        lists[label] = {"top": items, "users": users}
        lists["served"] = lists[label]
    if last.get("summary"):
        lists.update(run_artifacts(last["summary"], split))
    if not args.skip_peers:
        for label, peer in (("ALS (grid)", als_peer), ("item-kNN (grid)", knn_peer),
                            ("EASE (grid)", ease_peer)):
            if peer is ease_peer and split.shape[1] > EASE_MAX_ITEMS:
                print(f"   EASE (grid): skipped ({split.shape[1]:,} items > {EASE_MAX_ITEMS:,})")
                continue
            print(f"   {label}: tuning on valid", flush=True)
            info[label] = peer(split)
            lists[label] = info[label]
    lists["popularity"] = popularity(split)
    shown = {k: v for k, v in lists.items() if k != "served"}
    scores = report_quality(split.name, shown, split.test, info)
    if "served" in lists:
        scores["served"] = scores[next(k for k in lists if k.startswith("served ("))]
    return summary_line(split, runs, ratios(scores))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default="ml-1m-implicit,amazon-beauty",
                    help=f"comma-separated of {', '.join(CHOICES)}")
    ap.add_argument("--repeats", type=int, default=1, help="product runs per data set")
    ap.add_argument("--keep", action="store_true", help="keep the temp directory")
    ap.add_argument("--warm", action="store_true",
                    help=f"hold back the newest {WARM_SHARE * 100:g}%% of the events, ingest them "
                         "after the first train and train again (warm)")
    ap.add_argument("--skip-peers", action="store_true", help="popularity only, no ALS/kNN/EASE")
    ap.add_argument("--max-users", type=int, help="a random subsample of users (smoke runs)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lookups-child", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.lookups_child:
        return lookups_child(*args.lookups_child)
    names = [n for n in args.data.split(",") if n]
    unknown = [n for n in names if n not in CHOICES]
    if unknown or not names:
        ap.error(f"--data {','.join(unknown)}: expected some of {', '.join(CHOICES)}")
    tmp = Path(tempfile.mkdtemp(prefix="rs-scale-"))
    print(f"code: {REPO}; temp: {tmp}{' (kept)' if args.keep else ''}; {os.cpu_count()} cores")
    # numba caches compiled kernels beside the sources of the tree that runs: a fresh checkout
    # compiles them (tens of seconds, hundreds of MB) in the first child that calls them. That
    # is `infra/setup.sh`'s job, not a retrain's: done once here, its time printed apart.
    warm = run_step("warm-up", [sys.executable, "-c", "import solvers; solvers.warm_up()"],
                    child_env(tmp, tmp / "warm-home"), tmp)
    print(f"kernels compiled or loaded from numba's cache: {warm['wall']:.1f} s, peak RSS "
          f"{warm['peak_rss'] / GB:.2f} GB (not in the steps' figures)")
    lines = []
    try:
        for name in names:
            split = load(name, args.seed)
            if split is None:
                continue
            if args.max_users:
                split = subsample(split, args.max_users, args.seed)
            set_tmp = tmp / name
            set_tmp.mkdir()
            lines.append(run_set(split, args, set_tmp))
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    print()
    for line in lines:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
