"""AltSVM on Ray workers (issue 52): the same factors, duals, objective and iterations as the
one-process fit, bit for bit, whatever the number of workers, cold and warm.

The orchestration runs first on plain objects in threads (:class:`solvers.altsvm_ray.InProcess`:
every call and hand-over of a real cluster, without one), then on a real local Ray cluster
(``infra/ray/start.sh``: a head and two worker nodes, separate processes on loopback), driven
from a process of its own as ``rankstream train`` drives it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from solvers import AltSVM
from solvers import _altsvm_solver as S
from solvers._base import rng_of
from solvers.altsvm_ray import InProcess, solve_on_workers
from tests.solvers.ray_driver import fit_arrays, fits

DRIVER = Path(__file__).with_name("ray_driver.py")


def comparisons(seed: int, n_users: int, n_items: int, n: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    winners = rng.integers(0, n_items, n)
    losers = (winners + 1 + rng.integers(0, n_items - 1, n)) % n_items
    return np.c_[rng.integers(0, n_users, n), winners, losers]


def same_bits(a: dict, b: dict) -> list:
    """The names of the arrays that differ in a bit (or a shape)."""
    return [k for k in a if a[k].shape != b[k].shape or a[k].tobytes() != b[k].tobytes()]


@pytest.mark.parametrize("loss, bias, parts", [("squared_hinge", True, None),
                                               ("hinge", False, None),
                                               ("squared_hinge", False, 1)])
def test_workers_in_process_give_the_one_process_bits(monkeypatch, loss, bias, parts):
    """1, 2 and 3 workers, cold then warm on grown data; ``parts=1``: the V rebuild is one sum
    over every user, continued from worker to worker across all of them."""
    if parts is not None:
        monkeypatch.setattr(S, "V_PARTS", parts)
    c = comparisons(1, 500, 200, 40_000)
    params = {"rank": 6, "reg": 40.0, "loss": loss, "item_bias": bias, "max_iter": 5,
              "n_threads": 2, "random_state": 3}
    cold, warm = fits(c[:30_000], c, params)
    want = {"cold": fit_arrays(cold), "warm": fit_arrays(warm)}
    order = {k: np.argsort(x[:, 0], kind="stable") for k, x in (("cold", c[:30_000]),
                                                                 ("warm", c))}
    for workers in (1, 2, 3):
        for phase, state, rng, max_iter in (("cold", None, 3, 5),
                                            ("warm", cold.warm_state(), 3, 5)):
            data = c[:30_000] if phase == "cold" else c
            cols = data[order[phase]].T.astype(np.int32)
            res, _, _ = solve_on_workers(cols, 500, 200, state, rank=6, reg=40.0, loss=loss,
                                      fit_bias=bias, max_iter=max_iter, tol=3e-4,
                                      rng=rng_of(rng), n_workers=workers, runner=InProcess())
            got = {"U": res.U, "V": res.V, "b": res.b, "alpha": res.alpha, "beta": res.beta,
                   "objective": res.objective, "n_iter": np.array(res.n_iter),
                   "comparisons": cols}
            assert not same_bits(want[phase], got), (workers, phase, same_bits(want[phase], got))


def test_a_ray_fit_is_refused_in_one_line_when_it_cannot_run():
    c = comparisons(2, 20, 10, 200)
    with pytest.raises(ValueError, match="ray_address is 'localhost', expected HOST:PORT"):
        AltSVM(ray_address="localhost").fit(c)
    with pytest.raises(ValueError, match="the lock-free V-step runs in one process only"):
        AltSVM(ray_address="127.0.0.1:6390", deterministic=False).fit(c)
    # nothing listens there: one line at once (ray.init would retry for minutes)
    from tests.servers import free_port

    address = f"127.0.0.1:{free_port()}"
    with pytest.raises(ConnectionError, match=f"no Ray cluster answers at {address} .*: "
                                              "start one"):
        AltSVM(reg=1.0, ray_address=address).fit(c)


def test_a_real_ray_cluster_gives_the_one_process_bits(ray_address, tmp_path, shared_data):
    """MovieLens 100K's ratings as comparisons (each user's pairs of different ratings, the
    higher one winning), the first 80% of the rows cold then all of them warm: on 1 and 2
    workers of a real cluster, the bits of one process."""
    from solvers import pairs_from_ratings

    raw = np.loadtxt(shared_data / "movielens-100k" / "u.data", dtype=np.int64)
    users, items = raw[:, 0] - 1, raw[:, 1] - 1
    c = pairs_from_ratings(users, items, raw[:, 2].astype(float))
    c = c[np.random.default_rng(0).permutation(len(c))[:600_000]]
    first = c[: int(0.8 * len(c))]
    params = {"rank": 8, "reg_ratio": 0.2, "item_bias": True, "max_iter": 4,
              "random_state": 5}
    cold, warm = fits(first, c, params)
    src = tmp_path / "in.npz"
    np.savez(src, first=first, second=c, params=json.dumps(params))
    for workers in (1, 2):
        out = tmp_path / f"out-{workers}.npz"
        run = subprocess.run([sys.executable, str(DRIVER), ray_address, str(workers), str(src),
                              str(out)], capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, run.stderr[-3000:]
        got = np.load(out)
        for phase, model in (("cold", cold), ("warm", warm)):
            arrays = {k: got[f"{phase}_{k}"] for k in fit_arrays(model)}
            assert not same_bits(fit_arrays(model), arrays), (workers, phase)


def _shard_processes(session: Path) -> list[int]:
    """Pids of the AltSVM workers (``ray::UserShard``) whose raylet runs in ``session``."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            title = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            parent = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            raylet = Path(f"/proc/{parent}/cmdline").read_bytes().decode(errors="replace")
        except (OSError, ValueError, IndexError):
            continue
        if title.startswith("ray::UserShard") and str(session) in raylet:
            found.append(int(proc.name))
    return found


def test_a_worker_killed_mid_fit_leaves_the_same_bits(ray_address, ray_session, tmp_path):
    """SIGKILL one AltSVM worker while a 2-worker fit runs: the fit starts again on the
    cluster's workers and ends with the one-process bits, saying what was retried."""
    import os
    import signal
    import time

    c = comparisons(7, 20_000, 2_000, 1_500_000)
    params = {"rank": 16, "reg": 30.0, "item_bias": True, "max_iter": 6, "random_state": 1}
    cold, warm = fits(c[:1_200_000], c, params)
    src, out = tmp_path / "in.npz", tmp_path / "out.npz"
    np.savez(src, first=c[:1_200_000], second=c, params=json.dumps(params))
    driver = subprocess.Popen([sys.executable, str(DRIVER), ray_address, "2", str(src),
                               str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    try:
        deadline = time.monotonic() + 120
        while len(_shard_processes(ray_session)) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(2.0)                          # into the fit, past the setup
        victims = _shard_processes(ray_session)
        assert victims, "no AltSVM worker to kill"
        os.kill(victims[0], signal.SIGKILL)
        stdout, stderr = driver.communicate(timeout=600)
    finally:
        driver.kill()
    assert driver.returncode == 0, stderr[-3000:]
    got = np.load(out)
    assert int(got["retried"]) >= 1, "the fit did not notice the killed worker"
    for phase, model in (("cold", cold), ("warm", warm)):
        arrays = {k: got[f"{phase}_{k}"] for k in fit_arrays(model)}
        assert not same_bits(fit_arrays(model), arrays), phase
