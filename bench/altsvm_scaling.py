"""AltSVM multi-core scaling: fit time per thread count, and the same fit on every count.

Default (issue #36): the synthetic problem of 200k users x 20k items with 4M comparisons,
rank 20 (as ``bench/altsvm_determinism.py``), λ = 0.3 reg_max, a fixed number of outer
iterations (tol = 0). For each thread count of ``--threads``: the median wall time of
``--repeats`` fits (thread counts interleaved, so all see the same machine load), the
speed-up over the first count, and whether the fit is bit-for-bit the one of the first count
(factors, bias, both duals, objective per iteration, iterations: a SHA-256 of them). The
first call's compile (or numba cache load, ``AltSVM.warm_up``), the data generation and
reg_max are reported apart. Needs only numpy, scipy, numba and this repository.

Run (about 4 min on 16 cores, most of it the 1-thread fits and the first compile):
``.venv/bin/python bench/altsvm_scaling.py --threads 1,2,4,8,16``; ``--quick`` is a smoke run
(0.4M comparisons, 2 iterations, 2 repeats); ``--deterministic no`` times the Hogwild V-step
(whose fits differ between runs; the check then says so).

``--profile`` adds issue #17's tables (sizes ``--sizes``, default then 4,40 million):

1. Per-phase times at ONE thread, in CPU seconds of that thread (robust to a busy machine:
   a phase's CPU time does not depend on how much of a core other programs leave it; wall
   times are shown too). Every kernel and driver function a fit calls from Python is wrapped
   with a timer (exclusive times, nested calls subtracted);
   a phase is *parallel* when the code that runs it with n_threads > 1 is a numba
   ``parallel=True`` kernel (the 1-thread fit runs its serial twin: ``ustep_serial`` for
   ``ustep_parallel``), everything else is serial (numpy calls, Python glue, serial kernels).
   Serial fraction s = serial time / total, and Amdahl's prediction for p threads,
   1 / (s + (1 − s)/p).
2. MovieLens 100K, all pairs (7.0M comparisons; ``solvers.pairs_from_ratings``), rank 10,
   10 outer iterations, when the data is at hand.
3. Peak memory per comparison: one fit per size in a child process whose peak resident set
   (VmHWM) is reset right before ``fit`` (``/proc/self/clear_refs``), extrapolated linearly
   to 200M comparisons.

Fits run in worker processes, one per version of the code: ``--compare DIR`` adds a worker
importing the ``solvers`` package in DIR (e.g. the code before a change), and the two take
turns fit by fit, so both see the same machine load.

Synthetic problem: 200k users x 20k items, M million comparisons (M·5 per user), a planted
rank-10 score matrix with logistic noise, rows in random order (as events arrive; the fit
sorts them by user).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import importlib  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import re  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
MOVIELENS = Path("/work/shared/data/movielens-100k/u.data")
PLANTED_RANK, REG_RATIO = 10, 0.3

# (module, attribute, phase): every function a fit calls from Python, in the code before and
# after issue #17 (names a version lacks are skipped). Exclusive time goes to the phase.
TIMED = [
    ("solvers.altsvm", "_check_comparisons", "validate"),
    ("solvers._altsvm_layout", "check_ids", "validate"),
    ("solvers._altsvm_solver", "by_user", "sort by user"),
    ("solvers._altsvm_layout", "count_users", "sort by user"),
    ("solvers._altsvm_layout", "user_totals", "sort by user"),
    ("solvers._altsvm_layout", "scatter_by_user", "sort by user"),
    ("solvers._altsvm_solver", "layout", "layout (glue)"),
    ("solvers._altsvm_solver", "user_blocks", "layout (glue)"),
    ("solvers._altsvm_kernels", "build_entries", "entries index"),
    ("solvers._altsvm_layout", "count_entries", "entries index"),
    ("solvers._altsvm_layout", "fill_entries", "entries index"),
    ("solvers._altsvm_solver", "cold_start", "start"),
    ("solvers._altsvm_solver", "warm_start", "start"),
    ("solvers._altsvm_solver", "join_duals", "start"),
    ("solvers._altsvm_kernels", "join_duals", "start"),
    ("solvers._altsvm_kernels", "users_from_duals", "start"),
    ("solvers._altsvm_solver", "solve", "loop (glue, copies)"),
    ("solvers._altsvm_solver", "v_accumulators", "loop (glue, copies)"),
    ("solvers._altsvm_kernels", "scatter_duals", "V rebuild"),
    ("solvers._altsvm_kernels", "items_from_duals", "V rebuild"),
    ("solvers._altsvm_solver", "strata", "V-step schedule"),
    ("solvers._altsvm_layout", "count_pairs", "V-step schedule"),
    ("solvers._altsvm_layout", "scatter_by_task", "V-step schedule"),
    ("solvers._altsvm_kernels", "take_duals", "V-step"),
    ("solvers._altsvm_kernels", "put_duals", "V-step"),
    ("solvers._altsvm_kernels", "vstep_strata", "V-step"),
    ("solvers._altsvm_kernels", "vstep_serial", "V-step"),
    ("solvers._altsvm_kernels", "vstep_hogwild", "V-step"),
    ("solvers._altsvm_kernels", "ustep_serial", "U-step"),
    ("solvers._altsvm_kernels", "ustep_parallel", "U-step"),
    ("solvers._altsvm_kernels", "user_shares", "objective"),
    ("solvers._altsvm_kernels", "sum_squares", "sum of squares"),
]
PARALLEL_TWIN = {"ustep_serial"}  # its n_threads > 1 version is parallel
KERNELS = ("V-step", "U-step")  # the iterations' CD kernels, shown apart in the thread table


# --------------------------------------------------------------------------- data

def synthetic(n_users: int, n_items: int, per_user: int, seed: int = 0) -> np.ndarray:
    """(user, winner, loser) rows in random order: per user ``per_user`` random item pairs,
    oriented by a planted rank-10 score matrix plus logistic noise."""
    rng = np.random.default_rng(seed)
    Us = rng.normal(size=(n_users, PLANTED_RANK)) / np.sqrt(PLANTED_RANK)
    Vs = rng.normal(size=(n_items, PLANTED_RANK))
    out = np.empty((n_users * per_user, 3), dtype=np.int64)
    step = max(1, 2_000_000 // per_user)
    for lo in range(0, n_users, step):
        hi = min(n_users, lo + step)
        u = np.repeat(np.arange(lo, hi), per_user)
        j = rng.integers(0, n_items, u.size)
        k = (j + rng.integers(1, n_items, u.size)) % n_items
        z = np.einsum("ij,ij->i", Us[u], Vs[j] - Vs[k])
        swap = rng.random(u.size) * (1.0 + np.exp(-z)) > 1.0  # P(j wins) = sigmoid(z)
        rows = out[lo * per_user:hi * per_user]
        rows[:, 0], rows[:, 1], rows[:, 2] = u, np.where(swap, k, j), np.where(swap, j, k)
    return out[rng.permutation(out.shape[0])]


def problem_data(spec: str) -> np.ndarray:
    """``synthetic:M`` (M million comparisons, 200k users x 20k items) or ``movielens``."""
    if spec == "movielens":
        from solvers.pairs import pairs_from_ratings

        d = np.loadtxt(MOVIELENS, dtype=np.int64)
        return pairs_from_ratings(d[:, 0] - 1, d[:, 1] - 1, d[:, 2].astype(float))
    return synthetic(200_000, 20_000, max(1, int(float(spec.split(":")[1]) * 1e6) // 200_000))


def model(threads: int, iters: int, reg: float | None, rank: int = 20,
          deterministic: bool = True):
    from solvers import AltSVM

    return AltSVM(rank=rank, reg=reg, max_iter=iters, tol=0.0, n_threads=threads,
                  deterministic=deterministic, random_state=0)


def digest(m) -> str:
    """SHA-256 of everything a fit learns: factors, bias, duals, objective, iterations."""
    import hashlib

    h = hashlib.sha256()
    for a in (m.user_factors_, m.item_factors_, m.item_bias_, m._alpha, m._beta, m.objective_,
              np.array([m.n_iter_])):
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


# --------------------------------------------------------------------------- worker process

class Phases:
    """Wraps the functions of TIMED with exclusive timers; ``parallel[phase]`` says whether a
    phase runs in parallel with n_threads > 1."""

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self.cpu: dict[str, float] = {}
        self.parallel: dict[str, bool] = {"fit (glue)": False}
        self._stack: list[list[float]] = []
        for module, name, phase in TIMED:
            try:
                mod = importlib.import_module(module)
            except ImportError:
                continue
            fn = getattr(mod, name, None)
            if fn is None:
                continue
            par = name in PARALLEL_TWIN or bool(getattr(fn, "targetoptions", {}).get("parallel"))
            key = f"{phase} [{'parallel' if par else 'serial'}]"
            self.parallel[key] = par
            setattr(mod, name, self._wrap(fn, key))

    def _wrap(self, fn, key):
        def timed(*args, **kwargs):
            self._stack.append([time.perf_counter(), 0.0, time.thread_time(), 0.0])
            try:
                return fn(*args, **kwargs)
            finally:
                start, inner, cpu_start, cpu_inner = self._stack.pop()
                spent = time.perf_counter() - start
                cpu = time.thread_time() - cpu_start
                self.seconds[key] = self.seconds.get(key, 0.0) + spent - inner
                self.cpu[key] = self.cpu.get(key, 0.0) + cpu - cpu_inner
                if self._stack:
                    self._stack[-1][1] += spent
                    self._stack[-1][3] += cpu
        return timed

    def fit(self, m, c) -> dict:
        """``m.fit(c)``: wall seconds and exclusive wall seconds per phase; the same in CPU
        seconds of the calling thread (``cpu``, ``cpu_phases``: the whole work when the fit
        runs on one thread, and unlike wall time not stretched by other programs)."""
        self.seconds, self.cpu = {}, {}
        t0, c0 = time.perf_counter(), time.thread_time()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            m.fit(c)
        wall, cpu = time.perf_counter() - t0, time.thread_time() - c0
        phases, cpu_phases = dict(self.seconds), dict(self.cpu)
        phases["fit (glue)"] = wall - sum(phases.values())
        cpu_phases["fit (glue)"] = cpu - sum(cpu_phases.values())
        return {"wall": wall, "phases": phases, "cpu": cpu, "cpu_phases": cpu_phases,
                "parallel": self.parallel, "digest": digest(m), "n_iter": int(m.n_iter_),
                "objective": float(m.objective_[-1])}


def worker(spec: str, max_threads: int) -> None:
    """Serve fits of one problem over stdin/stdout, one JSON object per line."""
    from solvers import AltSVM

    t0 = time.perf_counter()
    AltSVM.warm_up(n_threads=max_threads)
    warm = time.perf_counter() - t0
    t0 = time.perf_counter()
    c = problem_data(spec)
    phases = Phases()
    import numba

    print(json.dumps({"n": int(c.shape[0]), "warm_up": warm, "generate": time.perf_counter() - t0,
                      "layer": numba.threading_layer(),
                      "solvers": str(Path(sys.modules["solvers"].__file__).parent)}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["cmd"] == "regmax":
            t0 = time.perf_counter()
            value = AltSVM(n_threads=1).reg_max(c)
            out = {"reg_max": value, "seconds": time.perf_counter() - t0}
        elif cmd["cmd"] == "fit":
            out = phases.fit(model(cmd["threads"], cmd["iters"], cmd["reg"], cmd["rank"],
                                   cmd["deterministic"]), c)
        else:
            return
        print(json.dumps(out), flush=True)


class Worker:
    """A worker process for the ``solvers`` package in ``code``."""

    def __init__(self, code: Path, spec: str, max_threads: int):
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--worker", spec, "--code", str(code), "--threads",
             str(max_threads)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.info = self._read()

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"worker exited with {self.proc.wait()}")
        return json.loads(line)

    def ask(self, **cmd) -> dict:
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        self.proc.stdin.write(json.dumps({"cmd": "quit"}) + "\n")
        self.proc.stdin.close()
        self.proc.wait()


# --------------------------------------------------------------------------- tables

def amdahl(s: float, p: int) -> float:
    return 1.0 / (s + (1.0 - s) / p)


def serial_fraction(run: dict, clock: str = "") -> float:
    """Share of the fit spent in phases that stay on one thread (clock "" wall, "cpu_" CPU)."""
    phases = run[f"{clock}phases"]
    return sum(v for k, v in phases.items() if not run["parallel"][k]) / sum(phases.values())


def med(values) -> float:
    return statistics.median(values) if values else 0.0


def phase_table(name: str, n: int, iters: int, rank: int, runs: dict) -> dict:
    """Per-phase medians at 1 thread per version; returns {version: serial fraction}."""
    out = {}
    for version, rs in runs.items():
        walls, cpus = [r["wall"] for r in rs], [r["cpu"] for r in rs]
        total, total_cpu = med(walls), med(cpus)
        keys = sorted({k for r in rs for k in r["phases"]},
                      key=lambda k: -med([r["cpu_phases"].get(k, 0.0) for r in rs]))
        fractions = [serial_fraction(r, "cpu_") for r in rs]
        walls_s = [serial_fraction(r) for r in rs]
        s = out[version] = med(fractions)
        print(f"\n{name} [{version}]: {n:,} comparisons, rank {rank}, {iters} outer "
              f"iterations, 1 thread, {len(rs)} fits: median CPU {total_cpu:.2f} s (min "
              f"{min(cpus):.2f}, max {max(cpus):.2f}), wall {total:.2f} s (min {min(walls):.2f}, "
              f"max {max(walls):.2f})")
        print(f"  {'phase':38s} {'CPU s':>8s} {'share':>7s} {'wall s':>9s}")
        for k in keys:
            sec = med([r["cpu_phases"].get(k, 0.0) for r in rs])
            wall = med([r["phases"].get(k, 0.0) for r in rs])
            print(f"  {k:38s} {sec:8.3f} {100 * sec / total_cpu:6.1f}% {wall:9.3f}")
        print(f"  serial fraction {100 * s:.2f} % of CPU time (median; per fit "
              + ", ".join(f"{100 * f:.2f}" for f in fractions) + " %; of wall time "
              + ", ".join(f"{100 * f:.2f}" for f in walls_s) + " %); Amdahl: "
              + ", ".join(f"{amdahl(s, p):.2f}x on {p}" for p in (2, 4, 8, 16)) + " threads",
              flush=True)
    return out


def thread_table(name: str, counts: list, runs: dict) -> list:
    """Median wall time per (version, thread count), with speed-ups and the identity check;
    returns summary lines."""
    versions = list(runs)
    print(f"\n{name}: median wall time per thread count (fits interleaved across versions and "
          f"thread counts; speed-up over {counts[0]} thread(s); in brackets the V-/U-step "
          "kernels alone; 'same' = bit-for-bit the fit of the first count)")
    base = {v: med([r["wall"] for r in runs[v][counts[0]]]) for v in versions}
    lines = []
    for v in versions:
        ref = runs[v][counts[0]][0]["digest"]
        all_same = all(r["digest"] == ref for t in counts for r in runs[v][t])
        lines.append(f"{name} [{v}]: " + ", ".join(
            f"{t} threads {base[v] / med([r['wall'] for r in runs[v][t]]):.2f}x" for t in counts)
            + f"; fits identical across thread counts and repeats: {'YES' if all_same else 'NO'}")
    for t in counts:
        cells = []
        for v in versions:
            rs = runs[v][t]
            wall = med([r["wall"] for r in rs])
            kern = med([sum(s for k, s in r["phases"].items() if k.startswith(KERNELS))
                        for r in rs])
            kern1 = med([sum(s for k, s in r["phases"].items() if k.startswith(KERNELS))
                         for r in runs[v][counts[0]]])
            ref = runs[v][counts[0]][0]["digest"]
            same = sum(r["digest"] == ref for r in rs)
            cells.append(f"{v}: {wall:7.2f} s {base[v] / wall:5.2f}x [{kern:6.2f} s "
                         f"{kern1 / kern:5.2f}x] same {same}/{len(rs)} "
                         f"(objective {rs[0]['objective']:.10g}, {rs[0]['n_iter']} iterations)")
        ratio = ""
        if len(versions) == 2:
            a, b = (med([r["wall"] for r in runs[v][t]]) for v in versions)
            ratio = f"   {versions[1]}/{versions[0]} {b / a:.2f}"
        print(f"  {t:2d} threads  " + "   ".join(cells) + ratio, flush=True)
        for v in versions:  # where the time goes at this count (median wall s per phase)
            keys = sorted({k for r in runs[v][t] for k in r["phases"]},
                          key=lambda k: -med([r["phases"].get(k, 0.0) for r in runs[v][t]]))
            print(f"      [{v}] " + ", ".join(
                f"{k.split(' [')[0]} {med([r['phases'].get(k, 0.0) for r in runs[v][t]]):.3f}"
                for k in keys[:6]), flush=True)
    return lines


def run_problem(spec: str, name: str, iters: int, codes: dict, counts: list, repeats: int,
                skip: set, summary: list, rank: int, deterministic: bool) -> float:
    """Phase and thread tables of one problem for every version; returns the reg used."""
    workers = {v: Worker(code, spec, max(counts)) for v, code in codes.items()}
    first = next(iter(workers.values())).info
    print(f"\n== {name}: {first['n']:,} comparisons (data made in {first['generate']:.1f} s); "
          f"first call (compile or cache load, AltSVM.warm_up): " + ", ".join(
              f"[{v}] {w.info['warm_up']:.1f} s" for v, w in workers.items())
          + f"; numba threading layer {first['layer']}", flush=True)
    reg = None
    for v, w in reversed(list(workers.items())):  # this checkout's first: its reg is used
        if reg is not None and "regmax-before" in skip:
            break
        r = w.ask(cmd="regmax")
        reg = reg or REG_RATIO * r["reg_max"]
        print(f"  [{v}] reg_max (what reg=None computes; not part of the fits below): "
              f"{r['seconds']:.2f} s at 1 thread; reg_max {r['reg_max']:.6g}; fits use reg = "
              f"{REG_RATIO:g} reg_max = {reg:.6g}", flush=True)
    fit = dict(cmd="fit", iters=iters, reg=reg, rank=rank, deterministic=deterministic)
    if "phases" not in skip:
        runs = {v: [] for v in workers}
        for _ in range(repeats):
            for v, w in workers.items():
                runs[v].append(w.ask(**fit, threads=1))
        fractions = phase_table(name, first["n"], iters, rank, runs)
        for v, s in fractions.items():
            summary.append(f"{name} [{v}]: serial fraction {100 * s:.2f} % -> Amdahl "
                           f"{amdahl(s, 16):.2f}x on 16 threads; 1-thread fit "
                           f"{med([r['cpu'] for r in runs[v]]):.2f} s CPU, "
                           f"{med([r['wall'] for r in runs[v]]):.2f} s wall")
    if "threads" not in skip:
        runs = {v: {t: [] for t in counts} for v in workers}
        for _ in range(repeats):
            for t in counts:
                for v, w in workers.items():
                    runs[v][t].append(w.ask(**fit, threads=t))
        summary += thread_table(name, counts, runs)
    for w in workers.values():
        w.close()
    return reg


# --------------------------------------------------------------------------- memory

def status_kib(field: str) -> int:
    text = Path("/proc/self/status").read_text()
    return int(re.search(rf"{field}:\s+(\d+)", text).group(1))


def memory_child(spec: str, reg: float | None) -> None:
    """One 1-iteration fit at 1 thread; prints the resident bytes before it and its peak."""
    c = problem_data(spec)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model(1, 1, 1.0).fit(c[:1000])  # kernels loaded: their code is in the baseline
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
        before = status_kib("VmRSS")
        model(1, 1, reg).fit(c)
    print(json.dumps({"n": int(c.shape[0]), "before": before * 1024,
                      "peak": status_kib("VmHWM") * 1024, "input": int(c.nbytes)}))


def memory_table(specs_regs: list, codes: dict) -> None:
    print("\nPeak memory (resident set; a child process per fit, 1 thread, 1 outer iteration; "
          "'fit adds' = peak - resident before fit, the caller's array included before):")
    for v, code in codes.items():
        for reg_none in (False, True):
            rows = []
            for spec, reg in specs_regs:
                out = subprocess.run([sys.executable, __file__, "--memory-child", spec, "--reg",
                                      "none" if reg_none else repr(reg), "--code", str(code)],
                                     capture_output=True, text=True, check=True)
                r = json.loads(out.stdout.strip().splitlines()[-1])
                rows.append(r)
                extra = r["peak"] - r["before"]
                print(f"  [{v}] {'reg=None (reg_max + fit)' if reg_none else 'reg given':25s}"
                      f"{r['n']:>12,} comparisons: peak {r['peak'] / 2**30:6.2f} GiB; fit adds "
                      f"{extra / 2**30:6.2f} GiB = {extra / r['n']:6.1f} B/comparison (the "
                      f"caller's int64 array: {r['input'] / r['n']:.0f} B/comparison)", flush=True)
            big = max(rows, key=lambda r: r["n"])
            per = (big["peak"] - big["before"] + big["input"]) / big["n"]
            print(f"  [{v}] -> 200M comparisons{' with reg=None' if reg_none else ''}: "
                  f"{per:.1f} B/comparison (fit + int64 input, at {big['n']:,}) x 200M = "
                  f"{per * 200e6 / 2**30:.1f} GiB, + {(big['before'] - big['input']) / 2**30:.2f}"
                  " GiB interpreter and libraries (per-user/per-item arrays grow with the ids, "
                  "not with comparisons)", flush=True)


# --------------------------------------------------------------------------- main

def machine() -> str:
    cpu = platform.machine()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in
                   Path("/proc/cpuinfo").read_text().splitlines() if "model name" in line)
    except (OSError, StopIteration):
        pass
    load1, load5, _ = os.getloadavg()
    return (f"{platform.node()}: {os.cpu_count()} cores ({cpu}), load average {load1:.2f} "
            f"(1 min) {load5:.2f} (5 min), python {platform.python_version()}, "
            f"OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", default=None,
                    help="thread counts, e.g. 1,2,4,8,16 (default 1..os.cpu_count())")
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: 0.4M comparisons, 2 iterations, 2 repeats")
    ap.add_argument("--sizes", default=None,
                    help="millions of comparisons, 200k users (default 4; 4,40 with --profile)")
    ap.add_argument("--iters", type=int, default=5, help="outer iterations of the synthetic fits")
    ap.add_argument("--rank", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--deterministic", default="yes", choices=("yes", "no"),
                    help="AltSVM(deterministic=...): stratified (yes) or Hogwild (no) V-step")
    ap.add_argument("--profile", action="store_true",
                    help="also issue #17's per-phase table, MovieLens 100K and memory")
    ap.add_argument("--skip", default="",
                    help="comma list of: phases,threads,movielens,memory,synthetic,regmax-before")
    ap.add_argument("--code", default=str(REPO), help="directory holding the solvers package")
    ap.add_argument("--compare", default=None, help="directory of another solvers package, "
                    "fitted in turn with this one (labelled 'before')")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--memory-child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--reg", default="none", help=argparse.SUPPRESS)
    a = ap.parse_args()
    sys.path.insert(0, str(Path(a.code).resolve()))
    if a.worker is not None:
        worker(a.worker, int(a.threads))
        return
    if a.memory_child is not None:
        memory_child(a.memory_child, None if a.reg == "none" else float(a.reg))
        return
    sizes = a.sizes or ("4,40" if a.profile else "4")
    sizes = [0.4] if a.quick else [float(s) for s in sizes.split(",")]
    repeats, iters = (2, 2) if a.quick else (a.repeats, a.iters)
    skip = set(filter(None, a.skip.split(",")))
    if not a.profile:
        skip |= {"phases", "movielens", "memory"}
    counts = ([int(t) for t in a.threads.split(",")] if a.threads
              else list(range(1, os.cpu_count() + 1)))
    codes = {"after": Path(a.code).resolve()}
    if a.compare:
        codes = {"before": Path(a.compare).resolve(), **codes}
    print(machine())
    print("versions: " + ", ".join(f"{v} = {c}/solvers" for v, c in codes.items()))
    summary, specs_regs = [], []
    problems = [] if "synthetic" in skip else [
        (f"synthetic:{s:g}", f"synthetic {s:g}M (200k users x 20k items, "
         f"{max(1, int(s * 1e6) // 200_000)}/user, shuffled), rank {a.rank}, {iters} "
         f"iterations, deterministic={a.deterministic}", iters) for s in sizes]
    if "movielens" not in skip and MOVIELENS.exists():
        problems.append(("movielens", "MovieLens 100K all pairs", 10))
    began = time.perf_counter()
    for spec, name, n_iter in problems:
        reg = run_problem(spec, name, n_iter, codes, counts, repeats, skip, summary,
                          a.rank if spec != "movielens" else 10, a.deterministic == "yes")
        if spec != "movielens":
            specs_regs.append((spec, reg))
    if "memory" not in skip and specs_regs:
        memory_table(specs_regs, codes)
    print(f"\nsummary ({time.perf_counter() - began:.0f} s; " + machine() + "):")
    for line in summary:
        print("  " + line)


if __name__ == "__main__":
    main()
