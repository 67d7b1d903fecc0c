"""AltSVM's stratified V-step: the schedule, a plain-Python replay of it, and fits that are
bit-for-bit the same on 1, 2, 3 and 4 threads."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numba
import numpy as np
import pytest

from solvers import AltSVM, ConvergenceWarning
from solvers import _altsvm_kernels as K
from solvers import _altsvm_solver as S
from tests.solvers.test_altsvm import CODES, planted, ref_slope

REPO = Path(__file__).resolve().parents[2]


def random_layout(seed=0, n=3000, n_users=60, n_items=40):
    rng = np.random.default_rng(seed)
    w = rng.integers(0, n_items, n)
    lo = (w + rng.integers(1, n_items, n)) % n_items
    c = np.column_stack([rng.integers(0, n_users, n), w, lo])
    return S.layout(c, n_users, n_items), rng


def test_schedule_covers_every_comparison_once_in_disjoint_rounds():
    lay, _ = random_layout()
    st = S.strata(lay)
    B, n = st["n_blocks"], lay["cu"].shape[0]
    assert B % 2 == 0 and B >= 2
    assert np.array_equal(np.sort(st["perm"]), np.arange(n))
    order = st["item_order"]  # relabelled items: each block a contiguous range of rows
    assert np.array_equal(np.sort(order), np.arange(lay["n_items"]))
    assert np.array_equal(st["tu"], lay["cu"][st["perm"]])
    for name, col in (("tw", "cw"), ("tl", "cl")):
        assert np.array_equal(order[st["tw" if name == "tw" else "tl"]], lay[col][st["perm"]])
    rounds = S.tournament(B)
    assert len(rounds) == B and len(st["round_ptr"]) == B + 1
    seen = set()
    for pairs in rounds:  # each round: every block exactly once
        blocks = [p for pair in pairs for p in set(pair)]
        assert sorted(blocks) == list(range(B))
        seen |= {frozenset(pair) for pair in pairs}
    assert len(seen) == B * (B - 1) // 2 + B  # every pair and every diagonal once
    # a task's comparisons stay in user order, and the tasks of a round touch disjoint items
    for rho in range(B):
        items_of_round = set()
        for t in range(st["round_ptr"][rho], st["round_ptr"][rho + 1]):
            lo, hi = st["task_ptr"][t], st["task_ptr"][t + 1]
            items = set(st["tw"][lo:hi]) | set(st["tl"][lo:hi])
            assert not items & items_of_round
            items_of_round |= items
            assert np.all(np.diff(st["perm"][lo:hi]) > 0)
    assert st["task_ptr"][-1] == n


def test_schedule_depends_on_the_data_only():
    lay, _ = random_layout(1)
    ref = S.strata(lay)
    for threads in range(1, numba.config.NUMBA_NUM_THREADS + 1):
        numba.set_num_threads(threads)
        try:
            st = S.strata(lay)
        finally:
            numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
        for k in ref:
            assert np.array_equal(st[k], ref[k]), k


def replay(st, beta_t, U, V, b, fit_bias, reg, loss, seed):
    """The schedule of :func:`_altsvm_kernels.vstep_strata`, serially in plain Python."""
    n_rounds = st["round_ptr"].shape[0] - 1
    order = np.arange(n_rounds)
    K._shuffle(order, 0, n_rounds, np.uint64(seed))
    for rho in order:
        for t in range(st["round_ptr"][rho], st["round_ptr"][rho + 1]):
            c0, c1 = st["task_ptr"][t], st["task_ptr"][t + 1]
            if c1 == c0:
                continue
            _, z = K.next_u64(np.uint64(K._stream_seed(np.uint64(seed), t)))
            start = int(z % np.uint64(c1 - c0))
            for s in range(c1 - c0):
                c = c0 + (start + s) % (c1 - c0)
                i, j, k = st["tu"][c], st["tw"][c], st["tl"][c]
                x = np.r_[U[i], 1.0] if fit_bias else U[i]
                g = U[i] @ (V[j] - V[k]) + (b[j] - b[k] if fit_bias else 0.0)
                a_new = K.dual_step(loss, beta_t[c], g, 2 * (x @ x) / reg)
                d = (a_new - beta_t[c]) / reg
                beta_t[c] = a_new
                V[j] += d * U[i]
                V[k] -= d * U[i]
                if fit_bias:
                    b[j] += d
                    b[k] -= d


@pytest.mark.parametrize("loss", ["squared_hinge", "hinge", "logistic"])
@pytest.mark.parametrize("fit_bias", [False, True])
def test_strata_kernel_matches_python_replay_on_every_thread_count(loss, fit_bias):
    lay, rng = random_layout(2, n=800)
    st = S.strata(lay)
    r, reg = 3, 0.7
    U = rng.normal(size=(60, r))
    n_rounds = st["round_ptr"].shape[0] - 1
    ref = [np.zeros(800), np.zeros((40, r)), np.zeros(40)]
    for epoch in range(3):
        replay(st, *ref[:1], U, ref[1], ref[2], fit_bias, reg, CODES[loss], 1000 + epoch)
    runs = []
    for threads in range(1, numba.config.NUMBA_NUM_THREADS + 1):
        state = [np.zeros(800), np.zeros((40, r)), np.zeros(40)]
        numba.set_num_threads(threads)
        try:
            for epoch in range(3):
                order, seed = np.empty(n_rounds, np.int64), np.uint64(1000 + epoch)
                K.epoch_rounds(order, seed)
                K.vstep_strata(order, st["round_ptr"], st["task_ptr"],
                               np.arange(st["task_ptr"].shape[0] - 1), st["tu"], st["tw"],
                               st["tl"], state[0], U, state[1], state[2], fit_bias, reg,
                               CODES[loss], seed)
        finally:
            numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
        runs.append(state)
    for name, x, y in zip(("beta", "V", "b"), runs[0], ref):
        np.testing.assert_allclose(x, y, atol=1e-10, err_msg=name)
    for other in runs[1:]:
        for x, y in zip(runs[0], other):
            assert np.array_equal(x, y)


@pytest.mark.parametrize("loss", ["squared_hinge", "logistic"])
def test_strata_vstep_converges_to_v_subproblem_optimum(loss):
    """Many stratified epochs with U fixed meet the KKT conditions of problem (6)."""
    lay, rng = random_layout(4, n=300, n_users=12, n_items=10)
    st = S.strata(lay)
    r, reg = 3, 0.6
    U = rng.normal(size=(12, r))
    beta_t, V, b = np.zeros(300), np.zeros((10, r)), np.zeros(10)
    order = np.empty(st["round_ptr"].shape[0] - 1, np.int64)
    tasks = np.arange(st["task_ptr"].shape[0] - 1)
    for epoch in range(3000):
        K.epoch_rounds(order, np.uint64(epoch))
        K.vstep_strata(order, st["round_ptr"], st["task_ptr"], tasks, st["tu"], st["tw"],
                       st["tl"], beta_t, U, V, b, True, reg, CODES[loss], np.uint64(epoch))
    tu, tw, tl = st["tu"], st["tw"], st["tl"]  # (items relabelled: V and b are too)
    z = np.einsum("ij,ij->i", U[tu], V[tw] - V[tl]) + b[tw] - b[tl]
    np.testing.assert_allclose(beta_t, ref_slope(loss, z), atol=1e-6)
    V_ref = np.zeros_like(V)
    np.add.at(V_ref, tw, beta_t[:, None] * U[tu] / reg)
    np.add.at(V_ref, tl, -beta_t[:, None] * U[tu] / reg)
    np.testing.assert_allclose(V, V_ref, atol=1e-9)


def fit_digests(threads_list, warm=False):
    """Digest per thread count of fits on one planted problem (reg=None: reg_max too)."""
    c = planted(seed=11, n_users=80, n_items=70, per_user=150)
    out = {}
    for threads in threads_list:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            m = AltSVM(rank=3, item_bias=True, max_iter=12, tol=1e-5, n_threads=threads,
                       random_state=5).fit(c[:-300])
            if warm:
                m = AltSVM(rank=3, item_bias=True, max_iter=4, n_threads=threads,
                           random_state=6).fit(c, warm_start=m.warm_state())
        h = hashlib.sha256()
        for k, v in sorted(m.warm_state().items()):
            h.update(k.encode() + np.ascontiguousarray(v).tobytes())
        h.update(m.objective_.tobytes() + np.int64(m.n_iter_).tobytes())
        out[threads] = (h.hexdigest(), int(m.n_iter_), float(m.objective_[-1]))
    return out


def test_fits_are_bit_for_bit_the_same_on_1_2_3_and_4_threads():
    """Factors, bias, both duals, objective per iteration and n_iter, cold and warm, are the
    same for a given seed whatever the thread count. Threads beyond numba's pool run in a
    child process started with NUMBA_NUM_THREADS=4."""
    here = [t for t in (1, 2, 3, 4) if t <= numba.config.NUMBA_NUM_THREADS]
    local = {w: fit_digests(here, warm=w) for w in (False, True)}
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); "
            "from tests.solvers.test_altsvm_parallel import fit_digests; "
            "print(json.dumps({w: fit_digests([1, 2, 3, 4], warm=w == 'warm') "
            "for w in ('cold', 'warm')}))")
    env = {**os.environ, "NUMBA_NUM_THREADS": "4", "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", code, str(REPO)], capture_output=True,
                         text=True, env=env, cwd=REPO, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    child = json.loads(out.stdout.strip().splitlines()[-1])
    for warm, name in ((False, "cold"), (True, "warm")):
        digests = {tuple(v) for v in child[name].values()}
        digests |= {tuple(v) for v in local[warm].values()}
        assert len(digests) == 1, (name, child[name], local[warm])


def test_stratified_fit_has_the_quality_of_the_serial_schedule():
    """Same objective (within the V-step's noise, 2e-3) and test accuracy as the serial
    block-shuffled V-step (Hogwild on one thread)."""
    c = planted(seed=8, n_users=60, per_user=200)
    test = planted(seed=8, n_users=60, per_user=60, pair_seed=108)
    fits = {}
    for deterministic in (True, False):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            fits[deterministic] = m = AltSVM(rank=3, reg=10.0, item_bias=True, max_iter=30,
                                             tol=1e-6, n_threads=1, random_state=0,
                                             deterministic=deterministic).fit(c)
        assert np.all(np.diff(m.objective_) <= 1e-12 * m.objective_[:-1])
    s, h = fits[True], fits[False]
    assert s.objective_[-1] == pytest.approx(h.objective_[-1], rel=2e-3)

    def accuracy(m):
        return np.mean(m.predict(test[:, 0], test[:, 1]) > m.predict(test[:, 0], test[:, 2]))

    assert abs(accuracy(s) - accuracy(h)) < 0.01
