"""Load test of the HTTP API (`rankstream serve`, issue 27 "Load test"): a real HTTP load
generator against a real server and a real redis-server, side by side with the Python lookup
client doing the same operations in process, so the cost of HTTP is visible.

What runs, all on loopback and under ``~/.local/state/rankstream/bench/serve-load-*`` (removed
at the end unless ``--keep``):

1. a redis-server (``infra/redis/start.sh`` on a free port, stopped by pid at the end);
2. four published models, so ``/metrics`` reads as many as the target names:
   ``movies`` (user_item, AltSVM; trained on MovieLens 100K when ``../shared/data`` has it,
   else 6,000 x 4,000 synthetic factors; rank 32, top-100 lists, pairwise fold-in),
   ``search`` (query_docs with a kernel RankSVM scorer for ``rank``; trained on LETOR 4.0
   MQ2008 fold 1 when present, else 2,000 random support vectors of 46 features),
   ``popular`` (global_list) and ``reviews`` (predicted_ratings);
3. ``rankstream serve --server granian`` and ``--server uvicorn`` (``--servers``), each with
   ``--workers`` processes on its own free port, started with Popen and stopped by its pid
   (SIGTERM, then SIGKILL of its own process group after 20 s);
4. Debian's ``wrk`` with ``bench/serve_load.lua`` (rotates over prepared requests of many users
   and items; bounded by ``--seconds`` and ``--max-requests``), two kinds of runs:

   - *saturating* (closed loop): at concurrency 1, 16 and 64 every connection sends its next
     request as soon as the answer is in, for recommend (one user, GET), batch recommend (64
     users, POST), similar (GET), fold_in (20 items, POST), rank (50 candidates, POST). They
     measure capacity; at concurrency c > 1 the latency is queueing: by Little's law the mean
     latency is c / (requests/s), whatever the server's speed;
   - *paced*: the same connections offer a fixed total rate (``RATES``: recommend 3,000 req/s
     at concurrency 16 and 64, similar 2,000 at 16, fold_in 500 at 1 and 16; ``--rate-*``),
     the latency of a server running below capacity, which is what the issue's targets are
     about. The Lua script sends on a schedule and records how late each request left (see
     its header);

   each scenario first gets an unmeasured warm-up (first calls load a version's factors and
   compile kernels in every worker);
5. the same operations through ``pipeline.serving.lookup.TopK`` in this process (one thread),
   one after another and, for a paced scenario, one every ``workers / rate`` seconds (one
   worker's share of the rate, idle between calls as a worker is);
6. ``/metrics``: ``--scrapes`` scrapes timed with httpx after the load, and the server's own
   count of answers by status;
7. correctness: a sample of requests of every scenario over HTTP against the Python client
   (same items, same scores, same source and version), under each server;
8. the recommend scenario under both servers (both up, runs alternating: ``--compare-rounds``
   saturating rounds at concurrency 16, one at 1 and 64, one paced round at 16), so a busy
   spell of the shared machine hits both alike;
9. per run, the CPU the server's processes, redis-server, wrk and everything else on the
   machine took (/proc), which says whether a run was limited by the cores or by a neighbour;
10. ``--servers granian,floor``: the floor, granian with the same settings serving an app that
   only answers (``bench/floor_app.py``: one fixed body the size of a recommend answer), in the
   same alternating recommend runs: its p99 at the paced rate is what the machine allows any
   Python ASGI app under this load, rankstream's lookups and all its middleware left out;
   ``floor-redis``, the same app making one Redis GET per request first, as a lookup's version
   check does: the floor of any app that answers from Redis.

The tables give per-request p50/p99 (from writing the request to the end of the answer),
wrk's own p99 next to it ("p99 CO": wrk 4 corrects its histogram for coordinated omission,
adding the requests a client sending every (connections / requests/s) would have sent while a
slow answer was outstanding; the script receives it corrected and this program undoes that
for the per-request columns), requests/s over the run (a run that hits ``--max-requests``
stops early, marked ``*``), and the mean time inside the API's handler, from the server's own
histogram. The targets are checked against the paced runs (and the saturating runs at
concurrency 1, which have no queue).

    .venv/bin/python bench/serve_load.py [--quick] [--seconds 5] [--workers 2]

About 4 minutes by default on 2 cores, 75 s with ``--quick``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import warnings
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from pipeline.serving.artifact import ModelArtifact  # noqa: E402
from pipeline.serving.http_metrics import FLUSH_SECONDS  # noqa: E402
from pipeline.serving.lookup import TopK  # noqa: E402
from pipeline.serving.publish import publish  # noqa: E402
from pipeline.settings import state_dir  # noqa: E402

LUA = Path(__file__).with_suffix(".lua")
DATA = REPO.parent / "shared" / "data"
NAMESPACE = "bench"
FOLD_IN = {"method": "pairwise", "reg": 1.0, "loss": "squared_hinge", "per_item": 10}
CONCURRENCY = (1, 16, 64)
SCENARIOS = ("recommend", "batch64", "similar", "fold_in", "rank")
ROUTE = {"recommend": "recommend", "batch64": "recommend", "similar": "similar",
         "fold_in": "fold_in", "rank": "rank"}
# paced runs: scenario -> (total requests/s the connections offer together, concurrencies);
# the rates are the (3,000 req/s of recommend) or a load a 2-core server should carry
RATES = {"recommend": (3000.0, (16, 64)), "similar": (2000.0, (16,)), "fold_in": (500.0, (1, 16))}
TARGETS = {"recommend_p99_ms_c16": 2.0, "recommend_rps_c16": 3000.0,
           "recommend_p50_ms_c1": 1.0, "fold_in_p99_ms": 5.0, "similar_p99_ms": 2.0,
           "metrics_ms": 50.0}
TARGET_TEXT = {  # (scenario, concurrency, paced) -> what the tables print next to the numbers
    ("recommend", 1, False): "p50 <= 1 ms",
    ("recommend", 16, False): "capacity: >= 3,000 req/s",
    ("similar", 1, False): "p99 <= 2 ms", ("fold_in", 1, False): "p99 <= 5 ms",
    ("recommend", 16, True): "p99 <= 2 ms, sustains 3,000 req/s",
    ("similar", 16, True): "p99 <= 2 ms", ("fold_in", 16, True): "p99 <= 5 ms",
}
# --servers ...,floor: the same granian serving an app that only answers (bench/floor_app.py)
FLOOR = "floor"
FLOOR_REDIS = "floor-redis"     # the same, with one Redis GET per request first
FLOORS = (FLOOR, FLOOR_REDIS)
FLOOR_SERVE = """\
from granian import Granian
from granian.constants import Interfaces
Granian("floor_app:app", factory=True, address="127.0.0.1", port={port},
        interface=Interfaces.ASGI, workers={workers}, log_access=False, log_level="warning",
        workers_kill_timeout=5).serve()
"""
# each paced scenario's p99 target (the rounds within it are counted)
PACED_P99_MS = {"recommend": TARGETS["recommend_p99_ms_c16"],
                "similar": TARGETS["similar_p99_ms"], "fold_in": TARGETS["fold_in_p99_ms"]}
LATE_MS = 2.0      # a paced request that left this much after its slot was sent late
LATE_SHARE = 0.01   # a paced run with more of its requests late did not hold its schedule
MODELS_TOML = """\
[models.movies]
algorithm = "altsvm"
[models.search]
algorithm = "kernel_ranksvm"
[models.popular]
algorithm = "toppush"
[models.reviews]
algorithm = "npsvor"
"""


def say(t0: float, message: str) -> None:
    """One progress line on stderr (the results go to stdout)."""
    print(f"[{time.perf_counter() - t0:5.0f} s] {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------- models

@dataclass
class Models:
    """The published artifacts and what the requests are made of."""

    movies: ModelArtifact
    users: list            # user ids of ``movies``
    items: list            # item ids of ``movies``
    baskets: list          # per request: 20 item ids a new user met
    search: ModelArtifact
    candidates: list       # (doc id, 46 features) a re-ranking call sends
    others: dict           # name -> artifact (published so /metrics covers 4 models)
    origin: dict = field(default_factory=dict)   # model -> where it came from


def movielens_movies(path: Path, rank: int, seed: int) -> tuple[ModelArtifact, list, str]:
    """AltSVM (implicit comparisons, 10 per rating, item bias) trained on all of ML-100K."""
    from pipeline.training.trainers.altsvm_comparisons import make_comparisons
    from solvers import AltSVM

    d = np.loadtxt(path / "u.data", dtype=np.int64)
    u, i, r = d[:, 0] - 1, d[:, 1] - 1, d[:, 2].astype(np.float64)
    n_users, n_items = int(u.max()) + 1, int(i.max()) + 1
    comparisons, _ = make_comparisons(u, i, r, n_items, implicit_per_item=10, seed=seed)
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")     # ConvergenceWarning at max_iter: fine for a bench
        model = AltSVM(rank=rank, item_bias=True, max_iter=20, random_state=seed).fit(
            comparisons, n_users=n_users, n_items=n_items)
    fit_s = time.perf_counter() - t0
    order = np.lexsort((i, u))
    indptr = np.concatenate([[0], np.cumsum(np.bincount(u, minlength=n_users))])
    art = ModelArtifact.user_item(
        user_ids=np.arange(1, n_users + 1), item_ids=np.arange(1, n_items + 1),
        user_factors=model.user_factors_, item_factors=model.item_factors_,
        item_bias=model.item_bias_, seen=(indptr, i[order]), algorithm="altsvm",
        params={"rank": rank}, fold_in=FOLD_IN)
    met = [(i[order][indptr[x]:indptr[x + 1]] + 1).tolist() for x in range(n_users)]
    return art, met, (f"MovieLens 100K ({n_users:,} users x {n_items:,} items, "
                      f"{len(comparisons):,} comparisons), AltSVM rank {rank} fit {fit_s:.1f} s")


def synthetic_movies(n_users: int, n_items: int, rank: int,
                     seed: int) -> tuple[ModelArtifact, list, str]:
    """Random factors with AltSVM's shapes; ~50 seen items per user (as bench/lookup_latency)."""
    rng = np.random.default_rng(seed)
    nnz = rng.integers(20, 80, n_users)
    met = [np.sort(rng.choice(n_items, c, replace=False)) for c in nnz]
    indptr = np.concatenate([[0], np.cumsum(nnz)])
    art = ModelArtifact.user_item(
        user_ids=np.arange(n_users), item_ids=np.arange(n_items) + 1_000_000,
        user_factors=rng.standard_normal((n_users, rank), dtype=np.float32) / np.sqrt(rank),
        item_factors=rng.standard_normal((n_items, rank), dtype=np.float32),
        item_bias=rng.standard_normal(n_items, dtype=np.float32) * 0.1,
        seen=(indptr, np.concatenate(met)), algorithm="altsvm", params={"rank": rank},
        fold_in=FOLD_IN)
    return art, [(m + 1_000_000).tolist() for m in met], (
        f"synthetic ({n_users:,} users x {n_items:,} items, rank {rank})")


def letor_search(path: Path, seed: int) -> tuple[ModelArtifact, list, str]:
    """Kernel RankSVM (RBF) on LETOR 4.0 MQ2008 fold 1 train; candidates: fold 1 test docs."""
    from sklearn.datasets import load_svmlight_file

    from pipeline.serving.scorers import Scorer
    from solvers import KernelRankSVM

    X, y, q = load_svmlight_file(str(path / "Fold1" / "train.txt.gz"), query_id=True)
    X = X.toarray()
    t0 = time.perf_counter()
    model = KernelRankSVM(C=0.1, gamma=2.0 ** -4).fit(X, y, q)
    fit_s = time.perf_counter() - t0
    scores = model.decision_function(X).astype(np.float32)
    starts = np.flatnonzero(np.r_[True, q[1:] != q[:-1]])       # queries are contiguous
    indptr = np.r_[starts, len(q)]
    art = ModelArtifact.query_docs(
        query_ids=q[starts].astype(np.int64), doc_ids=[f"mq2008-{n}" for n in range(len(q))],
        indptr=indptr, docs=np.arange(len(q)), scores=scores, scorer=Scorer.kernel(model),
        algorithm="kernel_ranksvm", params={"C": 0.1, "gamma": 2.0 ** -4})
    Xt, _, _ = load_svmlight_file(str(path / "Fold1" / "test.txt.gz"), query_id=True,
                                  n_features=X.shape[1])
    Xt = np.round(Xt.toarray(), 6)
    pool = [(f"doc-{n}", Xt[n].tolist()) for n in range(Xt.shape[0])]
    return art, pool, (f"LETOR 4.0 MQ2008 fold 1 ({X.shape[0]:,} docs, {X.shape[1]} features), "
                       f"RBF kernel RankSVM, {model.support_vectors_.shape[0]:,} support "
                       f"vectors, fit {fit_s:.1f} s")


def synthetic_search(n_support: int, n_features: int, seed: int):
    """An RBF kernel scorer of ``n_support`` random support vectors (bench/lookup_latency)."""
    from pipeline.serving.scorers import Scorer

    rng = np.random.default_rng(seed)
    scorer = Scorer("kernel", {"n_features": n_features, "text_features": 0, "kernel": "rbf",
                               "gamma": 1.0 / n_features, "degree": 3, "coef0": 1.0},
                    {"support_vectors": rng.random((n_support, n_features), np.float32),
                     "dual_coef": rng.normal(size=n_support)})
    n_queries, per = 500, 20
    n = n_queries * per
    art = ModelArtifact.query_docs(
        query_ids=np.arange(n_queries), doc_ids=np.arange(n), indptr=np.arange(0, n + 1, per),
        docs=np.arange(n), scores=rng.random(n, np.float32), scorer=scorer,
        algorithm="kernel_ranksvm", params={"support": n_support})
    pool = [(f"doc-{n}", np.round(rng.random(n_features), 6).tolist()) for n in range(5000)]
    return art, pool, f"synthetic RBF scorer ({n_support:,} support vectors x {n_features})"


def build_models(args) -> Models:
    rng = np.random.default_rng(args.seed)
    ml = DATA / "movielens-100k"
    if args.data != "synthetic" and (ml / "u.data").exists():
        movies, met, movies_origin = movielens_movies(ml, args.rank, args.seed)
    else:
        movies, met, movies_origin = synthetic_movies(args.users, args.items, args.rank,
                                                      args.seed)
    letor = DATA / "letor4-mq2008"
    if args.data != "synthetic" and (letor / "Fold1" / "train.txt.gz").exists():
        search, pool, search_origin = letor_search(letor, args.seed)
    else:
        search, pool, search_origin = synthetic_search(2000, 46, args.seed)
    item_ids = movies.item_ids.tolist()
    baskets = []
    for _ in range(2000):   # 20 items a new user met: a real user's when the data is real
        user_items = met[int(rng.integers(len(met)))]
        baskets.append([int(x) for x in rng.choice(user_items, 20, replace=False)]
                       if len(user_items) >= 20 else
                       [int(x) for x in rng.choice(item_ids, 20, replace=False)])
    popularity = np.bincount(movies.seen_indices, minlength=movies.n_items).astype(np.float32)
    others = {
        "popular": ModelArtifact.global_list(item_ids=item_ids, scores=popularity,
                                             algorithm="toppush"),
        "reviews": ModelArtifact.predicted_ratings(
            item_ids=item_ids, ratings=rng.integers(1, 6, movies.n_items),
            scores=rng.random(movies.n_items), algorithm="npsvor"),
    }
    return Models(movies=movies, users=movies.key_ids.tolist(), items=item_ids,
                  baskets=baskets, search=search, candidates=pool, others=others,
                  origin={"movies": movies_origin, "search": search_origin})


# ---------------------------------------------------------------------- requests

@dataclass
class Request:
    """One HTTP request and the same question to the Python client."""

    method: str
    path: str
    body: dict | None
    call: tuple          # (TopK method name, args, kwargs)

    def line(self) -> str:
        body = "" if self.body is None else json.dumps(self.body, separators=(",", ":"))
        return f"{self.method}\t{self.path}\t{body}"


def scenario_requests(name: str, m: Models, n: int, rng) -> list[Request]:
    """``n`` requests of scenario ``name``, over many users / items / baskets."""
    base = "/v1/models/movies"
    out = []
    if name == "recommend":
        for u in rng.permutation(m.users)[:n].tolist() * (n // len(m.users) + 1):
            out.append(Request("GET", f"{base}/recommend?user={u}&k=10", None,
                               ("recommend", ("movies", str(u)), {"k": 10})))
    elif name == "batch64":
        for _ in range(n):
            users = [int(u) for u in rng.choice(m.users, 64, replace=False)]
            out.append(Request("POST", f"{base}/recommend", {"users": users, "k": 10},
                               ("recommend_many", ("movies", users), {"k": 10})))
    elif name == "similar":
        for i in rng.permutation(m.items)[:n].tolist() * (n // len(m.items) + 1):
            out.append(Request("GET", f"{base}/similar?item={i}&k=10", None,
                               ("similar", ("movies", str(i)), {"k": 10})))
    elif name == "fold_in":
        for basket in m.baskets[:n]:
            out.append(Request("POST", f"{base}/fold_in", {"items": basket, "k": 10},
                               ("fold_in", ("movies", basket), {"k": 10, "comparisons": []})))
    elif name == "rank":
        for _ in range(n):
            pick = rng.choice(len(m.candidates), 50, replace=False)
            cands = [m.candidates[j] for j in pick.tolist()]
            out.append(Request(
                "POST", "/v1/models/search/rank",
                {"candidates": [{"id": d, "features": x} for d, x in cands], "k": 10},
                # what the server hands the client for a candidate object
                ("rank", ("search", [(d, {"features": x, "text": None}) for d, x in cands]),
                 {"k": 10, "query": None})))
    else:
        raise ValueError(f"scenario is {name!r}, expected one of {SCENARIOS}")
    return out[:n]


def ask(topk: TopK, req: Request):
    method, args, kwargs = req.call
    return getattr(topk, method)(*args, **kwargs)


def comparable_http(body: dict) -> list:
    answers = body["answers"] if "answers" in body else [body]
    return [([(x["item"], x["score"]) for x in a["items"]], a["source"], a["version"])
            for a in answers]


def comparable_python(result) -> list:
    recs = result if isinstance(result, list) else [result]
    return [([(i.item() if hasattr(i, "item") else i, float(s)) for i, s in r.items],
             r.source, r.version) for r in recs]


# ---------------------------------------------------------------------- processes

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def local_redis(root: Path):
    """A redis-server from infra/redis on a free loopback port, data under ``root``."""
    port = free_port()
    env = {**os.environ, "RANKSTREAM_REDIS_PORT": str(port),
           "RANKSTREAM_REDIS_DIR": str(root / "redis")}
    subprocess.run([REPO / "infra/redis/start.sh"], env=env, check=True, capture_output=True)
    try:
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        subprocess.run([REPO / "infra/redis/stop.sh"], env=env, capture_output=True)


def redis_pid(root: Path) -> int | None:
    try:
        return int((root / "redis" / "redis.pid").read_text().strip())
    except (OSError, ValueError):
        return None


@contextmanager
def serving(server: str, workers: int, redis_url: str, root: Path, log: Path):
    """``rankstream serve`` on a free loopback port; yields (base URL, pid). Stopped by its
    pid: SIGTERM and wait; after 20 s SIGKILL to the process group it leads (its own session,
    so only it and its workers)."""
    import httpx

    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "RANKSTREAM_API_TOKEN"}  # no token
    cmd = [sys.executable, "-m", "pipeline.cli", "serve", "--port", str(port),
           "--redis-url", redis_url, "--namespace", NAMESPACE, "--config",
           str(root / "models.toml"), "--home", str(root / "home"), "--server", server,
           "--workers", str(workers)]
    if server in FLOORS:    # granian as rankstream serve starts it, with bench/floor_app.py
        if server == FLOOR_REDIS:
            env["FLOOR_REDIS_URL"] = redis_url
        env["PYTHONPATH"] = str(REPO / "bench")
        cmd = [sys.executable, "-c", FLOOR_SERVE.format(port=port, workers=workers)]
    with open(log, "ab") as fh:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=fh, stderr=subprocess.STDOUT,
                                start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"rankstream serve ({server}) exited with status "
                                   f"{proc.returncode}; see {log}")
            try:
                if httpx.get(f"{base}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"rankstream serve ({server}) not ready in 60 s; see {log}")
            time.sleep(0.1)
        yield base, proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)   # the session this Popen started
            proc.wait()
        leftover = _group_alive(proc.pid, 5.0)   # e.g. multiprocessing's resource tracker
        if leftover:
            print(f"warning: {server} left processes in its group {proc.pid} 5 s after it "
                  "exited; killing them", file=sys.stderr)
            os.killpg(proc.pid, signal.SIGKILL)
        metrics_dir = state_dir("serve") / str(proc.pid)
        if metrics_dir.exists():
            print(f"warning: {server} left its metrics directory {metrics_dir}",
                  file=sys.stderr)


def _group_alive(pgid: int, wait: float) -> bool:
    """Whether the process group ``pgid`` still has members after up to ``wait`` seconds."""
    deadline = time.monotonic() + wait
    while True:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        if time.monotonic() > deadline:
            return True
        time.sleep(0.1)


class CpuMeter:
    """CPU seconds, between two snapshots, of the server's process group (per process), the
    redis-server, wrk (this program's reaped children) and the whole machine (/proc/stat)."""

    tick = os.sysconf("SC_CLK_TCK")

    def __init__(self, server_pgid: int, redis_pid: int | None):
        self.pgid, self.redis_pid = server_pgid, redis_pid

    def snapshot(self) -> dict:
        procs = {}
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                text = Path(entry.path, "stat").read_text()
            except OSError:
                continue
            fields = text[text.rindex(")") + 2:].split()
            pid = int(entry.name)
            if int(fields[2]) == self.pgid or pid == self.redis_pid:
                procs[pid] = (int(fields[11]) + int(fields[12])) / self.tick
        with open("/proc/stat") as fh:
            cpu = [int(x) for x in fh.readline().split()[1:]]
        busy = (sum(cpu) - cpu[3] - cpu[4]) / self.tick        # all but idle and iowait
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        return {"procs": procs, "busy": busy, "children": children.ru_utime
                + children.ru_stime, "wall": time.monotonic()}

    def delta(self, a: dict, b: dict) -> dict:
        per = {pid: b["procs"][pid] - a["procs"].get(pid, 0.0) for pid in b["procs"]}
        redis_s = per.pop(self.redis_pid, 0.0)
        server_s = sum(per.values())
        workers = sorted((v for pid, v in per.items() if pid != self.pgid), reverse=True)
        wall = b["wall"] - a["wall"]
        wrk_s = b["children"] - a["children"]
        busy = b["busy"] - a["busy"]
        return {"server_s": server_s, "redis_s": redis_s, "wrk_s": wrk_s, "busy_s": busy,
                "other_s": max(busy - server_s - redis_s - wrk_s, 0.0), "wall_s": wall,
                "worker_split": [w / server_s for w in workers[:4]] if server_s else []}


def run_wrk(base: str, lines_file: Path, connections: int, seconds: int, max_requests: int,
            threads: int, rate: float = 0.0) -> dict:
    """One wrk run: the Lua script's JSON line, requests/s, per-request latency percentiles
    (``p50_us``, ``p99_us``, ...: wrk's correction undone, see :func:`uncorrected`) and wrk's
    own, corrected for coordinated omission (``wrk_p50_us``, ``wrk_p99_us``, ...).

    ``rate`` > 0: paced, the connections together offer ``rate`` requests/s (each wrk thread
    its share); ``lag_p99_ms``, ``lag_max_ms`` and ``late`` (requests that left over
    ``LATE_MS`` after their slot) say whether the schedule held."""
    t = max(1, min(threads, connections))
    histogram = lines_file.with_suffix(".histogram")
    lag_file = Path(f"{histogram}.lag")             # the Lua script's name for it
    histogram.unlink(missing_ok=True)
    lag_file.unlink(missing_ok=True)
    cmd = ["wrk", "-t", str(t), "-c", str(connections), "-d", f"{seconds}s", "--timeout", "5s",
           "-s", str(LUA), base, "--", str(lines_file), str(max(1, max_requests // t)),
           str(histogram), f"{rate / t:.6f}"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 60)
    line = next((x for x in out.stdout.splitlines() if x.startswith("WRK_JSON ")), None)
    if out.returncode != 0 or line is None:
        raise RuntimeError(f"wrk failed (status {out.returncode}): {out.stderr[-500:]}"
                           f"{out.stdout[-500:]}")
    r = json.loads(line[len("WRK_JSON "):])
    r["capped"] = r["capped_threads"] > 0    # a capped thread stops: the duration is shorter
    r["rps"] = r["requests"] / max(r["duration_us"] * 1e-6, 1e-9)
    r["socket_errors"] = sum(r[f"errors_{x}"] for x in ("connect", "read", "write", "timeout"))
    pairs = np.loadtxt(histogram, dtype=np.int64, ndmin=2) if histogram.stat().st_size else \
        np.zeros((0, 2), np.int64)
    values, counts = uncorrected(pairs[:, 0], pairs[:, 1], r["duration_us"], r["requests"],
                                 connections)
    r["recorded"] = int(counts.sum())       # == requests, unless some took over 5 s
    for name in ("p50", "p90", "p99", "mean", "max"):
        r[f"wrk_{name}_us"] = r.pop(f"{name}_us")
    for name, q in (("p50", 50), ("p99", 99), ("p999", 99.9)):
        r[f"{name}_us"] = float(_wrk_percentile(values, counts, q))
    r["mean_us"] = float((values * counts).sum() / max(counts.sum(), 1))
    r["offered"] = rate
    if rate > 0:
        lag = np.loadtxt(lag_file, ndmin=1) if lag_file.exists() else np.zeros(0)
        r["lag_p99_ms"] = float(np.percentile(lag, 99)) if len(lag) else float("nan")
        r["lag_max_ms"] = float(lag.max()) if len(lag) else float("nan")
        r["late"] = int((lag > LATE_MS).sum())
    return r


def uncorrected(values: np.ndarray, counts: np.ndarray, runtime_us: int, complete: int,
                connections: int) -> tuple[np.ndarray, np.ndarray]:
    """The latency histogram as measured, from the one wrk 4 reports.

    wrk's ``stats_correct`` (coordinated-omission correction) takes E = runtime_us //
    (complete // connections) and, for every recorded latency n >= 2E, adds its count at
    n - E, n - 2E, ... while the value stays > E; it reads each bucket before anything is added
    to it (it walks upwards, additions go downwards). Undone from the top: a bucket n > E holds
    its own count plus those of every bucket n + jE (j >= 1) above it."""
    if complete // connections <= 0 or not len(values):
        return values, counts
    expected = runtime_us // (complete // connections)
    order = np.argsort(values)[::-1]
    raw = np.zeros_like(counts)
    added: dict = {}                      # residue mod E -> raw count of buckets above
    for j in order.tolist():
        n = int(values[j])
        residue = n % expected
        own = counts[j] - (added.get(residue, 0) if n > expected else 0)
        raw[j] = own
        added[residue] = added.get(residue, 0) + own
    keep = raw > 0
    return values[keep], raw[keep]


def _wrk_percentile(values: np.ndarray, counts: np.ndarray, q: float) -> float:
    """wrk's percentile: the first value whose cumulative count reaches round(q% n + 0.5)."""
    if not len(values):
        return float("nan")
    order = np.argsort(values)
    cum = np.cumsum(counts[order])
    rank = round(q / 100.0 * cum[-1] + 0.5)
    return float(values[order][min(np.searchsorted(cum, rank), len(cum) - 1)])


# ---------------------------------------------------------------------- measurements

def python_client(topk: TopK, reqs: list[Request], seconds: float, max_calls: int,
                  gap: float = 0.0) -> dict:
    """The same questions through TopK in this process, one thread, one after another, or
    ``gap`` seconds apart: one server worker's share of a paced rate, idle between calls as
    a worker is (on this machine a paced call costs more than one right after another: caches
    go cold and the cores sleep)."""
    for req in reqs[:20]:
        ask(topk, req)
    lat = []
    clock = time.perf_counter
    deadline = clock() + seconds
    while clock() < deadline and len(lat) < max_calls:
        for req in reqs[:max_calls - len(lat)]:
            if gap:
                time.sleep(gap)
            t0 = clock()
            ask(topk, req)
            lat.append(clock() - t0)
            if t0 > deadline:
                break
    lat = np.array(lat)
    return {"requests": len(lat), "rps": len(lat) / lat.sum(), "mean_us": lat.mean() * 1e6,
            "p50_us": np.percentile(lat, 50) * 1e6, "p99_us": np.percentile(lat, 99) * 1e6,
            "gap_ms": gap * 1e3}


def check_answers(base: str, topk: TopK, scenarios: dict, per_scenario: int) -> dict:
    """HTTP answers against the Python client's, for a sample of every scenario's requests."""
    import httpx

    matched, exact, total, bad = 0, 0, 0, []
    with httpx.Client(base_url=base, timeout=10) as http:
        for name, reqs in scenarios.items():
            step = max(1, len(reqs) // per_scenario)
            for req in reqs[::step][:per_scenario]:
                total += 1
                got = (http.get(req.path) if req.method == "GET"
                       else http.post(req.path, json=req.body))
                if got.status_code != 200:
                    bad.append(f"{name}: HTTP {got.status_code} {got.text[:200]}")
                    continue
                h, p = comparable_http(got.json()), comparable_python(ask(topk, req))
                if h == p:
                    matched += 1
                    exact += 1
                elif _close(h, p):
                    matched += 1
                else:
                    bad.append(f"{name} {req.path} {json.dumps(req.body)[:80]}: HTTP "
                               f"{str(h)[:160]} vs Python {str(p)[:160]}")
    return {"matched": matched, "exact": exact, "total": total, "bad": bad}


def _close(h: list, p: list) -> bool:
    """Same items, source and version; scores equal to 1e-6 relative."""
    if len(h) != len(p):
        return False
    for (hi, hs, hv), (pi, ps, pv) in zip(h, p):
        if hs != ps or hv != pv or [x for x, _ in hi] != [x for x, _ in pi]:
            return False
        if not np.allclose([s for _, s in hi], [s for _, s in pi], rtol=1e-6, atol=0):
            return False
    return True


def scrape(base: str, n: int) -> dict:
    """Time ``n`` scrapes of /metrics; the last one's counts of answers by route and status."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    lat = []
    with httpx.Client(base_url=base, timeout=10) as http:
        for _ in range(n):
            t0 = time.perf_counter()
            got = http.get("/metrics")
            lat.append(time.perf_counter() - t0)
            got.raise_for_status()
    by_status: dict = {}
    models = set()
    buckets: dict = {}          # route -> {le: count}, summed over models
    sums: dict = {}             # route -> [seconds, count]
    for fam in text_string_to_metric_families(got.text):
        for s in fam.samples:
            route = s.labels.get("route")
            if s.name == "rankstream_requests_total":
                key = (route, s.labels.get("status"))
                by_status[key] = by_status.get(key, 0) + s.value
            elif s.name == "rankstream_served_version":
                models.add(s.labels.get("model"))
            elif s.name == "rankstream_request_seconds_bucket":
                le = float(s.labels["le"])
                buckets.setdefault(route, {})[le] = buckets.get(route, {}).get(le, 0) + s.value
            elif s.name in ("rankstream_request_seconds_sum", "rankstream_request_seconds_count"):
                acc = sums.setdefault(route, [0.0, 0.0])
                acc[s.name.endswith("_count")] += s.value
    handler = {}
    for route, (total, count) in sums.items():
        if count:
            handler[route] = {"count": int(count), "mean_ms": total / count * 1e3,
                              "p50_ms": _bucket_quantile(buckets.get(route, {}), 0.5) * 1e3,
                              "p99_ms": _bucket_quantile(buckets.get(route, {}), 0.99) * 1e3}
    lat = np.array(lat) * 1e3
    return {"p50_ms": float(np.median(lat)), "p99_ms": float(np.percentile(lat, 99)),
            "n": n, "bytes": len(got.content), "by_status": by_status,
            "models": sorted(models), "handler": handler}


def handler_totals(base: str, route: str) -> tuple[float, float]:
    """(seconds, requests) the server's handlers of ``route`` have counted so far, all models
    and workers (``rankstream_request_seconds`` sum and count)."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    total = [0.0, 0.0]
    text = httpx.get(f"{base}/metrics", timeout=10).text
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.labels.get("route") == route and s.name in (
                    "rankstream_request_seconds_sum", "rankstream_request_seconds_count"):
                total[s.name.endswith("_count")] += s.value
    return total[0], total[1]


def _bucket_quantile(cumulative: dict, q: float) -> float:
    """The upper bound of the histogram bucket holding quantile ``q`` (cumulative counts)."""
    les = sorted(cumulative)
    if not les or not cumulative[les[-1]]:
        return float("nan")
    need = q * cumulative[les[-1]]
    return next(le for le in les if cumulative[le] >= need)


def log_problems(log: Path) -> list[str]:
    """Lines of the server's log that speak of errors or warnings."""
    if not log.exists():
        return []
    pattern = re.compile(r"traceback|error|exception|warn|critical|killed", re.IGNORECASE)
    return [x.rstrip() for x in log.read_text(errors="replace").splitlines()
            if pattern.search(x)]


# ---------------------------------------------------------------------- main

def measure(server: str, base: str, meter: CpuMeter, lines_file: Path, scenario: str, c: int,
            args, rate: float = 0.0) -> dict:
    """One measured wrk run (paced at ``rate`` requests/s in total when > 0) with the server's
    handler time and the CPU it took."""
    before = handler_totals(base, ROUTE[scenario])
    cpu0 = meter.snapshot()
    r = run_wrk(base, lines_file, c, args.seconds, args.max_requests, args.wrk_threads, rate)
    r["cpu"] = meter.delta(cpu0, meter.snapshot())
    time.sleep(2 * FLUSH_SECONDS)     # every worker's counts of the run written
    after = handler_totals(base, ROUTE[scenario])
    n = after[1] - before[1]
    r["handler_ms"] = (after[0] - before[0]) / n * 1e3 if n else None
    return {"scenario": scenario, "server": server, "c": c, **r}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="1 s per run, smaller samples")
    ap.add_argument("--seconds", type=int, default=5, help="wrk duration per run (default 5)")
    ap.add_argument("--warmup", type=int, default=1, help="unmeasured seconds per scenario")
    ap.add_argument("--max-requests", type=int, default=200_000,
                    help="requests per wrk run at most (default 200,000)")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                    help="server processes (default one per core)")
    ap.add_argument("--wrk-threads", type=int, default=1,
                    help="wrk threads (default 1: the server gets the cores)")
    ap.add_argument("--servers", default="granian,uvicorn",
                    help="servers to run; the first runs every scenario, the others recommend "
                    "('floor': granian serving an app that only answers, bench/floor_app.py)")
    ap.add_argument("--compare-rounds", type=int, default=5,
                    help="alternating rounds of the servers' saturating recommend runs at "
                    "concurrency 16 (default 5; 1 at concurrency 1 and 64, 1 paced)")
    ap.add_argument("--paced-rounds", type=int, default=0,
                    help="also alternate the servers over this many rounds of every paced "
                    "scenario at concurrency 16 (recommend, similar, fold_in at their rates), "
                    "and count the rounds within each p99 target")
    for name, (rate, conc) in RATES.items():
        ap.add_argument(f"--rate-{name.replace('_', '-')}", type=float, default=rate,
                        help=f"total req/s of the paced {name} runs at concurrency "
                        f"{', '.join(map(str, conc))} (default {rate:,.0f}; 0: none)")
    ap.add_argument("--data", choices=("auto", "synthetic"), default="auto",
                    help="auto: MovieLens 100K and LETOR MQ2008 when ../shared/data has them")
    ap.add_argument("--users", type=int, default=6000, help="synthetic users")
    ap.add_argument("--items", type=int, default=4000, help="synthetic items")
    ap.add_argument("--rank", type=int, default=32)
    ap.add_argument("--top-k", type=int, default=100)
    ap.add_argument("--check", type=int, default=40, help="answers compared per scenario")
    ap.add_argument("--scrapes", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--keep", action="store_true", help="keep the state directory (logs)")
    args = ap.parse_args(argv)
    if args.quick:
        args.seconds, args.warmup, args.check, args.scrapes = 1, 1, 10, 20
        args.compare_rounds = min(args.compare_rounds, 2)
    rates = {name: getattr(args, f"rate_{name}") for name in RATES}
    servers = [s.strip() for s in args.servers.split(",") if s.strip()]
    if not shutil.which("wrk"):
        print("wrk is not installed: apt-get install wrk", file=sys.stderr)
        return 1

    t0 = time.perf_counter()
    load_before = os.getloadavg()
    rng = np.random.default_rng(args.seed)
    say(t0, "building models")
    models = build_models(args)
    scenarios = {name: scenario_requests(name, models, 2000, rng) for name in SCENARIOS}
    root = Path(tempfile.mkdtemp(prefix="serve-load-", dir=state_dir("bench")))
    rows, compare, py, checks, scrapes, problems = [], [], {}, {}, {}, {}
    try:
        (root / "models.toml").write_text(MODELS_TOML)
        files = {}
        for name, reqs in scenarios.items():
            files[name] = root / f"requests-{name}.tsv"
            files[name].write_text("\n".join(r.line() for r in reqs) + "\n")
        with local_redis(root) as url:
            say(t0, f"redis at {url}; publishing 4 models")
            published = {}
            for name, art, top_k in (("movies", models.movies, args.top_k),
                                     ("search", models.search, 50),
                                     *((n, a, args.top_k) for n, a in models.others.items())):
                published[name] = publish(name, art, url, top_k=top_k, keep_versions=1,
                                          namespace=NAMESPACE).seconds
            topk = TopK(url, namespace=NAMESPACE, timeout=1.0)
            for name, reqs in scenarios.items():
                say(t0, f"python client: {name}")
                py[name] = python_client(topk, reqs, 1.0 if args.quick else 2.0, 5000)
                if rates.get(name):     # at one worker's share of the paced rate
                    py[name + " paced"] = python_client(
                        topk, reqs, 1.0 if args.quick else 4.0, 2000, args.workers / rates[name])
            with ExitStack() as stack:
                up = {}
                for s_i, server in enumerate(servers):
                    base, pid = stack.enter_context(serving(
                        server, args.workers, url, root, root / f"server-{server}.log"))
                    say(t0, f"{server} (pid {pid}, {args.workers} workers) at {base}")
                    up[server] = (base, CpuMeter(pid, redis_pid(root)))
                    for name in SCENARIOS if s_i == 0 else ("recommend",):
                        say(t0, f"{server} {name}: warm-up {args.warmup} s")
                        run_wrk(base, files[name], 16, args.warmup, args.max_requests,
                                args.wrk_threads)
                        if s_i > 0:
                            continue
                        for c in CONCURRENCY:
                            say(t0, f"{server} {name} c{c}: {args.seconds} s")
                            rows.append(measure(server, *up[server], files[name], name, c,
                                                args))
                        for c in RATES[name][1] if rates.get(name) else ():
                            say(t0, f"{server} {name} c{c} paced at {rates[name]:,.0f} req/s: "
                                f"{args.seconds} s")
                            rows.append(measure(server, *up[server], files[name], name, c,
                                                args, rates[name]))
                if len(servers) > 1:    # alternating, so a busy spell of the machine hits both
                    plan = [("recommend", c, 0.0, k) for c in CONCURRENCY
                            for k in range(args.compare_rounds if c == 16 else 1)]
                    if rates["recommend"] and not args.paced_rounds:
                        plan.append(("recommend", 16, rates["recommend"], 0))
                    plan += [(name, 16, rates[name], k) for k in range(args.paced_rounds)
                             for name in RATES if rates.get(name)]
                    for name, c, rate, k in plan:
                        for server in servers:
                            say(t0, f"compare: {server} {name} c{c} "
                                + (f"paced at {rate:,.0f} req/s, round {k + 1}" if rate
                                   else f"round {k + 1}"))
                            compare.append({**measure(server, *up[server], files[name],
                                                      name, c, args, rate),
                                            "round": k + 1})
                for server, (base, _) in up.items():
                    if server in FLOORS:
                        continue        # it answers one fixed body: nothing to compare
                    say(t0, f"{server}: comparing answers with the Python client")
                    checks[server] = check_answers(base, topk, scenarios, args.check)
                    say(t0, f"{server}: {args.scrapes} scrapes of /metrics")
                    scrapes[server] = scrape(base, args.scrapes)
            for server in servers:
                problems[server] = log_problems(root / f"server-{server}.log")
            topk.close()
    finally:
        if args.keep:
            print(f"(state kept in {root})", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)   # the directory made above, nothing else
    for server in servers[1:]:     # the other servers' recommend rows: their median rounds
        for c in CONCURRENCY:
            for paced in (False, True):
                runs = [r for r in compare if r["server"] == server and r["c"] == c
                        and bool(r["offered"]) == paced and r["scenario"] == "recommend"]
                if runs:
                    rows.append(_median_run(runs))
    report(args, models, published, rows, compare, py, checks, scrapes, problems, servers,
           time.perf_counter() - t0, load_before)
    return 0


def _median_run(runs: list[dict]) -> dict:
    """The run of median requests/s (the lower one of an even count)."""
    return sorted(runs, key=lambda r: r["rps"])[(len(runs) - 1) // 2]


def report(args, models, published, rows, compare, py, checks, scrapes, problems, servers,
           elapsed, load_before) -> None:
    first = servers[0]
    load_after = os.getloadavg()
    saturating = [r for r in rows if not r["offered"]]
    paced = [r for r in rows if r["offered"]]
    print(f"\nrankstream serve load test -- {args.workers} workers, wrk {args.wrk_threads} "
          f"thread(s), {args.seconds} s per run (cap {args.max_requests:,} requests), loopback")
    print(f"machine: {os.cpu_count()} cores, load average {load_before[0]:.2f} before, "
          f"{load_after[0]:.2f} after; wrk, server workers and redis share the cores")
    print(f"movies: {models.origin['movies']}; top-{args.top_k} lists, fold-in {FOLD_IN}")
    print(f"search: {models.origin['search']}")
    print("published in " + ", ".join(f"{n} {s:.2f} s" for n, s in published.items()))
    print("requests: recommend k=10 (GET, one user), batch64 (POST, 64 users, k=10), similar "
          "k=10 (GET), fold_in (POST, 20 items a user met, k=10), rank (POST, 50 candidates, "
          "k=10)")

    print("\nsaturating runs (closed loop: each connection sends its next request when the "
          "answer is in; capacity)")
    head = (f"{'scenario':10} {'server':>8} {'conc':>5} {'requests':>9} {'req/s':>9} "
            f"{'p50 ms':>8} {'p99 ms':>8} {'p99 CO':>8} {'non-2xx':>8} {'handler':>8}  target")
    print(head)
    print("-" * len(head))
    for name in SCENARIOS:
        for r in (r for r in saturating if r["scenario"] == name):
            note = TARGET_TEXT.get((name, r["c"], False), "") if r["server"] == first else (
                "(median of rounds below)" if "round" in r else "")
            print(_table_line(r, f"{r['rps']:>8,.0f}{'*' if r['capped'] else ' '}", note))
        for label, p in (("Python", py[name]), ("paced", py.get(name + " paced"))):
            if p is None:
                continue
            print(f"{name:10} {label:>8} {1:>5} {p['requests']:>9,} {p['rps']:>8,.0f}  "
                  f"{p['p50_us'] / 1e3:>8.3f} {p['p99_us'] / 1e3:>8.3f} {'-':>8} {'-':>8} "
                  f"{p['mean_us'] / 1e3:>8.3f}  (TopK in process" + (
                      "; handler = mean)" if label == "Python" else
                      f", a call every {p['gap_ms']:.0f} ms: one "
                      "worker's share of the paced rate)"))
    print("  Little's law: a closed loop of c connections keeps c requests in the system, so "
          "the mean latency is\n  c / (req/s) however fast the server is; above concurrency 1 "
          "these p50/p99 are the queue at full load,\n  not the latency at a given rate (see "
          "the paced runs). Here, c / (req/s) against the measured mean:")
    for r in (r for r in saturating if r["c"] > 1 and r["server"] == first):
        print(f"    {r['scenario']:10} c{r['c']:<3} {r['c']} / {r['rps']:,.0f} req/s = "
              f"{r['c'] / r['rps'] * 1e3:6.2f} ms; measured mean {r['mean_us'] / 1e3:6.2f} ms")

    if paced:
        print("\npaced runs (the connections together offer a fixed rate; sends on a schedule, "
              "one slot every 1/rate s)")
        head = (f"{'scenario':10} {'server':>8} {'conc':>5} {'requests':>9} {'offered':>8} "
                f"{'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'p99 CO':>8} {'non-2xx':>8} "
                f"{'handler':>8} {'late':>6} {'lag p99':>8} {'lag max':>8}  target")
        print(head)
        print("-" * len(head))
        for name in SCENARIOS:
            for r in (r for r in paced if r["scenario"] == name):
                note = TARGET_TEXT.get((name, r["c"], True), "") if r["server"] == first else ""
                print(_table_line(r, f"{r['offered']:>8,.0f} {r['rps']:>8,.0f} ", note,
                                  f" {r['late']:>6,} {r['lag_p99_ms']:>8.2f} "
                                  f"{r['lag_max_ms']:>8.2f}"))
        print(f"  late: requests that left more than {LATE_MS:g} ms after their slot (all "
              "connections busy, or wrk's own jitter);\n  lag p99/max: how late requests left, "
              "ms (wrk's timers tick in whole ms: +-1 ms is its clock). A run with at most\n"
              f"  {LATE_SHARE:.0%} late sent the offered rate, and its per-request p99 is the "
              "latency at that rate (the late ones\n  hide at most their lag). p99 CO assumes "
              "each connection sends every conc / (req/s) and adds the sends a\n  slow answer "
              "held up; here it overstates: a connection that falls behind takes a slot that is "
              "due and\n  sends at once")

    print("  p50/p99: per request, as measured (wrk's histogram with its correction undone); "
          "p99 CO: wrk's own p99, corrected\n  for coordinated omission (it adds the requests a "
          "constant-rate client would have sent while a slow one was\n  outstanding: a single "
          "stall of the machine raises it a lot)")
    print("  handler: mean ms per request inside the API's handler, server side, this run only "
          "(the rankstream_request_seconds\n  histogram's sum/count; for a POST it includes "
          "awaiting the body, so queueing behind other handlers)")
    every = [r for r in rows if "round" not in r] + compare     # each run once
    if any(r["capped"] for r in every):
        print("  * the run hit --max-requests before its duration; req/s is over its shorter "
              "time")
    short = [_run_name(r) for r in every if r["recorded"] != r["requests"]]
    if short:
        print("  latency not recorded for every request (over the 5 s timeout?): "
              + ", ".join(short))
    fives = [f"{_run_name(r)}: {r['status_5xx']}" for r in every if r["status_5xx"]]
    sockets = [f"{_run_name(r)}: {r['socket_errors']}" for r in every if r["socket_errors"]]
    print("  non-2xx includes wrk's socket errors (connect/read/write/timeout); 5xx: "
          + (", ".join(fives) if fives else "none")
          + "; socket errors: " + (", ".join(sockets) if sockets else "none"))

    print(f"\nwhere the CPU went during each run ({os.cpu_count()} cores; ms of CPU per "
          "request, and cores busy on average; run: max = saturating, rN its round, N/s paced):")
    print(f"  {'scenario':10} {'server':>8} {'conc':>5} {'run':>7} {'server':>8} {'redis':>7} "
          f"{'wrk':>7} {'cores: server':>14} {'redis':>6} {'wrk':>5} {'others':>7} {'idle':>5}"
          "  server CPU by process")
    for r in every:
        u, n = r["cpu"], max(r["requests"], 1)
        wall = max(u["wall_s"], 1e-9)
        idle = max(os.cpu_count() - u["busy_s"] / wall, 0.0)
        split = "/".join(f"{x:.0%}" for x in u["worker_split"] if x >= 0.005)
        run = (f"{r['offered']:,.0f}/s" if r["offered"]
               else "max" + (f" r{r['round']}" if "round" in r else ""))
        print(f"  {r['scenario']:10} {r['server']:>8} {r['c']:>5} {run:>7} "
              f"{u['server_s'] / n * 1e3:>8.3f} {u['redis_s'] / n * 1e3:>7.3f} "
              f"{u['wrk_s'] / n * 1e3:>7.3f} {u['server_s'] / wall:>14.2f} "
              f"{u['redis_s'] / wall:>6.2f} {u['wrk_s'] / wall:>5.2f} "
              f"{u['other_s'] / wall:>7.2f} {idle:>5.2f}  {split}")
    print("  (others: processes that are not this benchmark's: the machine is shared; server CPU "
          "by process: busiest first)")

    print("\nHTTP overhead, concurrency 1 (p50 over HTTP / p50 of TopK in process):")
    for name in SCENARIOS:
        r = _row(rows, name, first, 1)
        if r:
            extra = r["p50_us"] - py[name]["p50_us"]
            print(f"  {name:10} {r['p50_us'] / 1e3:.3f} ms vs {py[name]['p50_us'] / 1e3:.3f} ms:"
                  f" {extra / 1e3:+.3f} ms ({r['p50_us'] / py[name]['p50_us']:.1f}x)")

    if len(servers) > 1 and compare:
        for other in servers[1:]:       # each against the first
            report_servers(args, compare, [servers[0], other])

    print("\n/metrics scrape (after the load, 4 models configured):")
    for server, s in scrapes.items():
        statuses: dict = {}
        for (_, status), v in s["by_status"].items():
            statuses[status] = statuses.get(status, 0) + int(v)
        print(f"  {server}: median {s['p50_ms']:.1f} ms, p99 {s['p99_ms']:.1f} ms over "
              f"{s['n']} scrapes ({s['bytes']:,} bytes); models {s['models']}; server-side "
              f"answers by status {dict(sorted(statuses.items()))}")
        for (route, status), v in sorted(s["by_status"].items()):
            if not str(status).startswith("2"):
                print(f"    {route}: {int(v):,} answers with status {status}")
        print("    time in the handler, server side (rankstream_request_seconds, all runs "
              "and concurrencies, recommend\n    counts GET and the batch POST together; "
              "p50/p99 are bucket upper bounds):")
        for route, h in sorted(s["handler"].items(), key=lambda x: -x[1]["count"]):
            print(f"      {route:10} {h['count']:>8,} requests, mean {h['mean_ms']:.3f} ms, "
                  f"p50 <= {h['p50_ms']:g} ms, p99 <= {h['p99_ms']:g} ms")

    print("\ncorrectness (HTTP answer == TopK answer: items, scores, source, version):")
    for server, c in checks.items():
        print(f"  {server}: answers match: {c['matched']}/{c['total']}"
              f" (scores bit-identical in {c['exact']})")
        for line in c["bad"][:5]:
            print(f"    MISMATCH {line}")

    print("\nserver logs:")
    for server, lines in problems.items():
        if not lines:
            print(f"  {server}: no error or warning lines")
            continue
        unique = list(dict.fromkeys(lines))
        print(f"  {server}: {len(lines)} error/warning lines ({len(unique)} distinct), "
              "first ones:")
        for line in unique[:8]:
            print(f"    {line[:160]}")

    verdict = targets(rows, first, scrapes, checks, every)
    print(f"\ntargets ({first}, {args.workers} workers; p99 per request, as measured; latency "
          "targets at concurrency 16 against\nthe paced runs, since a saturating run's latency "
          f"is its queue; a paced run counts if at most {LATE_SHARE:.0%} of its requests\n"
          f"left over {LATE_MS:g} ms after their slot):")
    for text, ok in verdict:
        print(f"  [{'met' if ok else 'MISSED'}] {text}")
    print(f"\ntotal time {elapsed:.0f} s")


def _table_line(r: dict, rate_columns: str, note: str, extra: str = "") -> str:
    errs = r["non2xx"] + r["socket_errors"]
    return (f"{r['scenario']:10} {r['server']:>8} {r['c']:>5} {r['requests']:>9,} "
            f"{rate_columns}{r['p50_us'] / 1e3:>8.3f} {r['p99_us'] / 1e3:>8.3f} "
            f"{r['wrk_p99_us'] / 1e3:>8.2f} {errs:>8,} {_ms(r['handler_ms']):>8}{extra}  {note}")


def _run_name(r: dict) -> str:
    paced = f" at {r['offered']:,.0f} req/s" if r["offered"] else ""
    return f"{r['scenario']} {r['server']} c{r['c']}{paced}"


def report_servers(args, compare: list[dict], names: list[str]) -> None:
    """The servers side by side: every round, medians, the ratio, and whether rounds overlap."""
    a_name, b_name = names
    paced = (f"{args.paced_rounds} paced rounds of each paced scenario at c16"
             if args.paced_rounds else "one paced at c16")
    print(f"\nservers, same {args.workers} workers, both up, runs alternating "
          f"({args.compare_rounds} saturating recommend rounds at c16, one at c1 and c64, "
          f"{paced}):")
    groups = sorted({(r["scenario"], r["c"], r["offered"]) for r in compare},
                    key=lambda g: (g[2] > 0, SCENARIOS.index(g[0]), g[1]))
    for scenario, c, offered in groups:
        runs = {n: [r for r in compare if r["server"] == n and r["c"] == c
                    and r["offered"] == offered and r["scenario"] == scenario] for n in names}
        label = (f"{scenario} c{c} paced at {offered:,.0f} req/s" if offered
                 else f"{scenario} c{c} saturating")
        print(f"  {label}:")
        for n in names:
            print(f"    {n:8} " + "; ".join(
                f"{r['rps']:,.0f} req/s p50 {r['p50_us'] / 1e3:.3f} p99 {r['p99_us'] / 1e3:.3f}"
                f" ms (others {_others(r):.2f} cores)" for r in runs[n]))
        a, b = runs[a_name], runs[b_name]
        if not (a and b):
            continue
        ma = {k: float(np.median([r[k] for r in a])) for k in ("rps", "p50_us", "p99_us")}
        mb = {k: float(np.median([r[k] for r in b])) for k in ("rps", "p50_us", "p99_us")}
        print(f"    median{'s' if len(a) > 1 else ''}: {a_name} {ma['rps']:,.0f} req/s, p50 "
              f"{ma['p50_us'] / 1e3:.3f}, p99 {ma['p99_us'] / 1e3:.3f} ms; {b_name} "
              f"{mb['rps']:,.0f} req/s, p50 {mb['p50_us'] / 1e3:.3f}, p99 "
              f"{mb['p99_us'] / 1e3:.3f} ms; {a_name}/{b_name}: req/s "
              f"{ma['rps'] / mb['rps']:.2f}, p99 {ma['p99_us'] / mb['p99_us']:.2f}")
        if offered:        # same offered rate: the faster server answers sooner
            faster = a_name if ma["p99_us"] <= mb["p99_us"] else b_name
            print(f"    at the same offered rate the lower p99 is {faster}'s "
                  f"({min(ma['p99_us'], mb['p99_us']) / 1e3:.3f} vs "
                  f"{max(ma['p99_us'], mb['p99_us']) / 1e3:.3f} ms"
                  + ("; one round each, so no spread to compare with)" if len(a) == 1 else ")"))
            target = PACED_P99_MS.get(scenario)
            if target is not None:
                print(f"    rounds within p99 <= {target:g} ms: " + ", ".join(
                    f"{n} {sum(r['p99_us'] <= target * 1e3 for r in runs[n])} of "
                    f"{len(runs[n])}" for n in names))
        elif len(a) > 1 and len(b) > 1:
            print("    " + _overlap(a_name, [r["rps"] for r in a], b_name, [r["rps"] for r in b]))
    a = [r for r in compare if r["server"] == a_name and r["c"] == 16 and not r["offered"]]
    b = [r for r in compare if r["server"] == b_name and r["c"] == 16 and not r["offered"]]
    if a and b:
        ra, rb = np.median([r["rps"] for r in a]), np.median([r["rps"] for r in b])
        winner, ratio = (a_name, ra / rb) if ra >= rb else (b_name, rb / ra)
        spread = (" (the rounds overlap: within the machine's noise)"
                  if _overlaps([r["rps"] for r in a], [r["rps"] for r in b])
                  else " (the rounds do not overlap)")
        print(f"  at concurrency 16, saturating: {winner} is faster, {ratio:.2f}x the median "
              f"requests/s ({a_name} {ra:,.0f}, {b_name} {rb:,.0f}){spread}")


def _on_schedule(r: dict) -> bool:
    """A paced run held its schedule: at most ``LATE_SHARE`` of its requests left over
    ``LATE_MS`` after their slot (the lag p99 is within wrk's ms clock), so the offered rate
    was sent; the late ones understate the time from slot to answer by up to the lag max."""
    return r["late"] <= LATE_SHARE * r["requests"]


def _late(r: dict) -> str:
    return (f"{r['late']} of {r['requests']:,} sent over {LATE_MS:g} ms late, lag max "
            f"{r['lag_max_ms']:.1f} ms")


def _overlaps(a: list, b: list) -> bool:
    return min(a) <= max(b) and min(b) <= max(a)


def _overlap(a_name: str, a: list, b_name: str, b: list) -> str:
    text = (f"range of req/s over the rounds: {a_name} {min(a):,.0f}-{max(a):,.0f}, {b_name} "
            f"{min(b):,.0f}-{max(b):,.0f}: ")
    if _overlaps(a, b):
        return text + "they overlap"
    high = a_name if min(a) > max(b) else b_name
    return text + f"they do not overlap (every {high} round beat every other round)"


def targets(rows, first, scrapes, checks, every) -> list[tuple[str, bool]]:
    """(text, met) for each of the issue's targets; latency at concurrency 16 from the paced
    runs, throughput from the paced recommend run (it kept up with the offered rate) and the
    saturating one (capacity)."""
    verdict = []
    rec1 = _row(rows, "recommend", first, 1)
    rec16 = _row(rows, "recommend", first, 16)
    rec16p = _row(rows, "recommend", first, 16, paced=True)
    if rec16p:
        verdict.append((f"recommend p99 <= 2 ms at {rec16p['offered']:,.0f} req/s offered with "
                        f"16 connections ({rec16p['p99_us'] / 1e3:.2f} ms; {_late(rec16p)})",
                        rec16p["p99_us"] / 1e3 <= TARGETS["recommend_p99_ms_c16"]
                        and _on_schedule(rec16p)))
        need = TARGETS["recommend_rps_c16"]
        capacity = f", saturating capacity {rec16['rps']:,.0f}" if rec16 else ""
        verdict.append((f"recommend >= {need:,.0f} req/s with 16 connections (paced: "
                        f"{rec16p['rps']:,.0f} of {rec16p['offered']:,.0f} offered, "
                        f"{_late(rec16p)}{capacity})",
                        rec16p["offered"] >= need and rec16p["rps"] >= 0.99 * need
                        and _on_schedule(rec16p)))
    elif rec16:
        verdict.append((f"recommend >= 3,000 req/s at c16, saturating ({rec16['rps']:,.0f}; "
                        "no paced run)", rec16["rps"] >= TARGETS["recommend_rps_c16"]))
    if rec1:
        verdict.append((f"recommend p50 <= 1 ms at c1 ({rec1['p50_us'] / 1e3:.2f} ms)",
                        rec1["p50_us"] / 1e3 <= TARGETS["recommend_p50_ms_c1"]))
    for name, label, key in (("fold_in", "fold_in (20 items)", "fold_in_p99_ms"),
                             ("similar", "similar", "similar_p99_ms")):
        r = _row(rows, name, first, 1)
        if r:
            verdict.append((f"{label} p99 <= {TARGETS[key]:g} ms at c1 "
                            f"({r['p99_us'] / 1e3:.2f} ms)", r["p99_us"] / 1e3 <= TARGETS[key]))
        r = _row(rows, name, first, 16, paced=True)
        if r:
            verdict.append((f"{label} p99 <= {TARGETS[key]:g} ms at {r['offered']:,.0f} req/s "
                            f"offered with 16 connections ({r['p99_us'] / 1e3:.2f} ms; "
                            f"{_late(r)})",
                            r["p99_us"] / 1e3 <= TARGETS[key] and _on_schedule(r)))
    for server, s in scrapes.items():
        verdict.append((f"/metrics <= 50 ms, {server} (p99 {s['p99_ms']:.1f} ms)",
                        s["p99_ms"] <= TARGETS["metrics_ms"]))
    five = sum(r["status_5xx"] for r in every)
    verdict.append((f"zero 5xx over the load runs ({five})", five == 0))
    for server, c in checks.items():
        verdict.append((f"every sampled answer matches the Python client, {server} "
                        f"({c['matched']}/{c['total']})", c["matched"] == c["total"]))
    return verdict


def _others(r: dict) -> float:
    """Cores that processes not of this benchmark kept busy during run ``r``."""
    return r["cpu"]["other_s"] / max(r["cpu"]["wall_s"], 1e-9)


def _ms(value) -> str:
    return "-" if value is None else f"{value:.3f}"


def _row(rows, scenario, server, c, paced=False):
    return next((r for r in rows if r["scenario"] == scenario and r["server"] == server
                 and r["c"] == c and bool(r["offered"]) == paced), None)


if __name__ == "__main__":
    sys.exit(main())
