"""AltSVM on a Ray cluster: the one-process fit, bit for bit, with its comparisons on workers.

Who holds what. The users are cut into W contiguous ranges of about equal comparisons, one per
worker (a Ray actor, :class:`~solvers._altsvm_ray_worker.UserShard`). A worker lays its users'
comparisons out as one process does (by user, then as given), and holds their duals alpha and
beta, their rows of U and U_old, and runs their U-step; each user draws from the random
stream of its global number.
The V-step's tasks (pairs of item blocks, :func:`solvers._altsvm_solver.strata`) are dealt to
the workers round by round, largest first to the least loaded. A task's worker holds the
task's comparisons in task order with their beta, gathered once from the workers that hold
their users, worker after worker: the order of the one-process counting sort (by task, then
by user). The driver holds V, b, the schedule (items + blocks²) and the objective's per-user
shares; the comparisons arrive from the caller in phase one of issue 52 (workers reading the
event store themselves is the next step).

Why the bits are the same. Every floating-point operation is the one-process kernel's, on the
same operands in the same order: per user (U-step, shares, warm-start joins and rebuilds:
nothing crosses users); per task (a task runs whole on one worker, its items renumbered into
the blocks it was sent, its start drawn from its schedule number); per part of the V rebuild
(users summed in order, a part that two workers share continued by the second from where the
first left it, :func:`solvers._altsvm_kernels.add_users`); then V = Σ_p parts in order and
the objective = the sum of the whole array of per-user shares, both on the driver, as one
process sums them. Numba compiles the same kernels for the same argument types on every
worker; workers on different CPU models could round differently (fastmath may contract
multiplies and adds as the CPU allows): run a cluster of one CPU model, as the tests do.

What one outer iteration moves: U_old (users x rank) to every worker once; V and b to every
worker per U-step; per V-step round, the round's item blocks to and from the workers holding
its tasks; every beta from task workers back to user workers before each rebuild; the parts'
sums (parts x items x (rank + 1)) to the driver per rebuild.

:class:`InProcess` runs the same orchestration on plain objects (the unit tests'); :class:`OnRay`
on a cluster (``ray.init(address=...)``).
"""

from __future__ import annotations

import os

import numpy as np

from solvers import _altsvm_kernels as K
from solvers import _altsvm_solver as S
from solvers._altsvm_ray_worker import UserShard

INLINE_BYTES = 8 << 20     # Ray values passed inline up to this size (default 100 KiB)

# ---------------------------------------------------------------------- where calls run


class InProcess:
    """Workers as plain objects in this process, each call in a thread of its own (handles
    are futures, resolved where they are passed on), as Ray runs them: the unit tests'."""

    def __init__(self):
        from concurrent.futures import ThreadPoolExecutor

        self.pool = ThreadPoolExecutor(max_workers=64)

    def start(self, cls, *args):
        return cls(*args)

    def call(self, worker, method: str, *args):
        def run():
            return getattr(worker, method)(*[self.get(a) for a in args])
        return self.pool.submit(run)

    def get(self, value):
        from concurrent.futures import Future

        if isinstance(value, list):
            return [self.get(v) for v in value]
        return value.result() if isinstance(value, Future) else value

    def put(self, value):
        return value

    def close(self) -> None:
        self.pool.shutdown()


class OnRay:
    """Workers as Ray actors (one CPU each) on the cluster at ``address`` (``HOST:PORT``; this
    process connects on first use, to loopback as :mod:`solvers.ray_loopback` keeps it); a
    call is an ObjectRef, resolved by Ray where it is passed on, fetched only by :meth:`get`.
    An actor runs a few calls at once (a V-step epoch waits on blocks its peers send it,
    :meth:`UserShard.receive`); the actors end with the fit (:meth:`close`)."""

    def __init__(self, address: str, max_restarts: int = 0):
        import sys

        connected = "ray" in sys.modules and sys.modules["ray"].is_initialized()
        if not connected:
            _answers(address)      # before importing Ray: a wrong address costs nothing
        import ray

        from solvers.ray_loopback import is_loopback, keep_loopback

        if not connected:
            # a V-step round's blocks (~0.3 MB) go inline, not through the object store:
            # 1.4 ms a hop instead of 5.6 (the workers' nodes get it from infra/ray/start.sh)
            os.environ.setdefault("RAY_max_direct_call_object_size", str(INLINE_BYTES))
            if is_loopback(address):
                keep_loopback()
            ray.init(address=address, logging_level="ERROR", log_to_driver=False,
                     namespace="rankstream")
        self.ray = ray
        self.max_restarts = max_restarts
        self.actors: list = []

    def cpus(self) -> int:
        """CPUs of the cluster's nodes (the most workers a fit can have)."""
        return int(self.ray.cluster_resources().get("CPU", 0))

    def start(self, cls, *args):
        actor = self.ray.remote(cls).options(num_cpus=1, max_concurrency=4,
                                             max_restarts=self.max_restarts)
        self.actors.append(actor.remote(*args))
        return self.actors[-1]

    def call(self, worker, method: str, *args):
        return getattr(worker, method).remote(*args)

    def get(self, refs):
        return self.ray.get(refs)

    def put(self, value):
        return self.ray.put(value)

    def close(self) -> None:
        for actor in self.actors:
            self.ray.kill(actor)
        self.actors = []


def _answers(address: str, timeout: float = 5.0) -> None:
    """A connection to the head's port, or a one-line error: ``ray.init`` on an address where
    nothing listens retries for minutes, printing a line every few seconds."""
    import socket

    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except OSError as err:
        raise ConnectionError(f"no Ray cluster answers at {address} ({err.strerror or err}): "
                              "start one (infra/ray/start.sh) or unset "
                              "RANKSTREAM_RAY_ADDRESS / the model's ray_address") from None


# ---------------------------------------------------------------------- failures


def is_worker_failure(err: BaseException) -> bool:
    """Whether ``err`` says a worker process or node died (what starting again fixes), not
    that a call failed in our code."""
    try:
        from ray import exceptions as rx
    except ImportError:
        return False
    return isinstance(err, (rx.RayActorError, rx.WorkerCrashedError, rx.ObjectLostError,
                            rx.NodeDiedError)) and not isinstance(err, rx.RayTaskError)


# ---------------------------------------------------------------------- the driver's side


def plan_tasks(sizes: np.ndarray, round_ptr: np.ndarray, n_workers: int) -> np.ndarray:
    """The worker of each task: round by round, largest task first to the least loaded worker
    of that round (ties: the lower number), from the sizes alone.

    >>> plan_tasks(np.array([5, 3, 2, 4, 4]), np.array([0, 3, 5]), 2).tolist()
    [0, 1, 1, 0, 1]
    """
    owner = np.empty(sizes.shape[0], dtype=np.int64)
    for rho in range(round_ptr.shape[0] - 1):
        load = np.zeros(n_workers)
        tasks = np.arange(round_ptr[rho], round_ptr[rho + 1])
        for t in tasks[np.argsort(-sizes[tasks], kind="stable")]:
            w = int(np.argmin(load))
            owner[t] = w
            load[w] += sizes[t]
    return owner


class RayWork:
    """:class:`solvers._altsvm_solver.LocalWork`'s contract on workers (see the module)."""

    def __init__(self, cols: np.ndarray, n_users: int, n_items: int, rank: int, reg: float,
                 loss_code: int, fit_bias: bool, n_workers: int, runner=None):
        self.run = runner or InProcess()
        self.n_users, self.n_items, self.rank = n_users, n_items, rank
        self.fit_bias = fit_bias
        user_ptr = np.zeros(n_users + 1, dtype=np.int64)
        np.cumsum(np.bincount(cols[0], minlength=n_users), out=user_ptr[1:])
        self.bounds = S.user_parts(user_ptr, n_workers)      # worker w: users b[w]..b[w+1]-1
        run = self.run
        self.workers = [run.start(UserShard, int(lo), int(hi),
                                  cols[0, user_ptr[lo]:user_ptr[hi]],
                                  cols[1, user_ptr[lo]:user_ptr[hi]],
                                  cols[2, user_ptr[lo]:user_ptr[hi]], n_items, rank, reg,
                                  loss_code, fit_bias)
                        for lo, hi in zip(self.bounds[:-1], self.bounds[1:])]
        entries = np.concatenate(run.get([run.call(w, "entries") for w in self.workers]))
        entry_ptr = np.zeros(n_users + 1, dtype=np.int64)
        np.cumsum(entries, out=entry_ptr[1:])
        # the V rebuild's parts: the ranges v_accumulators gives one process
        self.parts = S.accumulator_parts(user_ptr + max(rank, 1) * entry_ptr,
                                         int(entry_ptr[-1]), 8 * n_items * (rank + 1))
        self.n = self.n_comparisons = int(user_ptr[-1])
        self._schedule()
        self.beta_moved, self.features_sent = False, False

    # -- setup
    def _schedule(self) -> None:
        """:func:`solvers._altsvm_solver.strata`'s schedule from the workers' counts, each
        task dealt to a worker, and the tasks' comparisons sent to their workers."""
        run, n_items = self.run, self.n_items
        n_blocks = S.n_item_blocks(self.n, n_items)
        degree = sum(run.get([run.call(w, "degrees") for w in self.workers]))
        item_block, self.item_order = S.item_blocks(degree, n_blocks)
        item_new = np.empty(n_items, dtype=np.int64)
        item_new[self.item_order] = np.arange(n_items)
        block_start = np.zeros(n_blocks + 1, dtype=np.int64)
        np.cumsum(np.bincount(item_block, minlength=n_blocks), out=block_start[1:])
        sizes = sum(run.get([run.call(w, "task_sizes", item_block, n_blocks)
                             for w in self.workers]))
        key_of_task, self.round_ptr, task_of_key = S.task_order(sizes, n_blocks)
        owner = plan_tasks(sizes[key_of_task], self.round_ptr, len(self.workers))
        item_new = item_new.astype(np.int32 if n_items <= np.iinfo(np.int32).max else np.int64)
        self.block_start, self.plans = block_start, []
        for k, worker in enumerate(self.workers):
            tasks, ptr, blocks = [], [0], []
            for rho in range(self.round_ptr.shape[0] - 1):
                here = [t for t in range(self.round_ptr[rho], self.round_ptr[rho + 1])
                        if owner[t] == k]
                tasks += here
                ptr.append(len(tasks))
                keys = key_of_task[here]
                blocks.append(sorted({int(x) for key in keys
                                      for x in (key // n_blocks, key % n_blocks)}))
            plan = {"tasks": tasks, "round_ptr": ptr, "blocks": blocks,
                    "block_start": block_start}
            rows = [run.call(w, "task_rows", k, tasks, task_of_key, item_new)
                    for w in self.workers]
            run.get(run.call(worker, "own_tasks", plan, *rows))
            self.plans.append(plan)
        block_worker = np.empty((self.round_ptr.shape[0] - 1, n_blocks), dtype=np.int64)
        for t, key in enumerate(key_of_task):
            rho = int(np.searchsorted(self.round_ptr, t, side="right") - 1)
            block_worker[rho, [key // n_blocks, key % n_blocks]] = owner[t]
        run.get([run.call(w, "set_peers", k, block_worker, *self.workers)
                 for k, w in enumerate(self.workers)])

    def start(self, U: np.ndarray) -> None:
        """Cold: the driver's random U, rows to their workers."""
        run = self.run
        run.get([run.call(w, "set_u", U[lo:hi])
                 for w, lo, hi in zip(self.workers, self.bounds[:-1], self.bounds[1:])])
        self._push_beta()

    def warm(self, state: dict, V: np.ndarray, clip_to: float) -> int:
        """Warm: the last fit's duals joined per worker, U rebuilt from alpha with ``V``;
        returns how many comparisons found their duals."""
        run, users = self.run, np.asarray(state["user"])
        calls = []
        for w, lo, hi in zip(self.workers, self.bounds[:-1], self.bounds[1:]):
            mine = (users >= lo) & (users < hi)
            calls.append(run.call(w, "join", users[mine], state["winner"][mine],
                                  state["loser"][mine], state["alpha"][mine],
                                  state["beta"][mine], clip_to))
        matched = int(sum(run.get(calls)))
        V_ref = run.put(V)
        run.get([run.call(w, "users_from_duals", V_ref) for w in self.workers])
        self._push_beta()
        return matched

    def _push_beta(self) -> None:
        """Every task's beta from the workers of its users (after the start or a join)."""
        run = self.run
        run.get([run.call(owner, "set_beta_t", *[run.call(w, "beta_to", k)
                                                 for w in self.workers])
                 for k, owner in enumerate(self.workers)])

    def _pull_beta(self) -> None:
        """Every comparison's beta back from its task's worker, when a V-step moved it."""
        if self.beta_moved:
            run = self.run
            run.get([run.call(w, "take_beta", *[run.call(owner, "beta_for", s)
                                                for owner in self.workers])
                     for s, w in enumerate(self.workers)])
            self.beta_moved = False

    # -- LocalWork's contract
    def swap(self) -> None:
        run = self.run
        run.get([run.call(w, "swap") for w in self.workers])
        self.features_sent = False

    def undo_u_step(self) -> None:
        run = self.run
        run.get([run.call(w, "undo_u_step") for w in self.workers])

    def rebuild(self, V: np.ndarray, b: np.ndarray) -> None:
        """V, b from beta with U_old: each part summed over its users in order (continued
        from worker to worker where it spans two), the parts added in order here. Per worker,
        the parts it starts go first and the one it continues last, so no worker waits on
        another's whole share (Ray runs a worker's calls in the order they were made)."""
        self._pull_beta()
        run, parts, bounds = self.run, self.parts, self.bounds
        pieces = []          # per part: [(worker, lo, hi)] in user order
        for lo, hi in zip(parts[:-1], parts[1:]):
            pieces.append([(w, max(lo, bounds[w]), min(hi, bounds[w + 1]))
                           for w in range(len(self.workers))
                           if max(lo, bounds[w]) < min(hi, bounds[w + 1])])
        sums = [None] * len(pieces)
        for w in range(len(self.workers)):
            for p in reversed(range(len(pieces))):
                if pieces[p] and pieces[p][0][0] == w:
                    _, lo, hi = pieces[p][0]
                    sums[p] = run.call(self.workers[w], "part_sum", int(lo), int(hi))
        for p, piece in enumerate(pieces):
            for w, lo, hi in piece[1:]:
                sums[p] = run.call(self.workers[w], "part_sum", int(lo), int(hi), sums[p])
        done = run.get([x for x in sums if x is not None])
        if len(done) == 1:
            V[:] = done[0][0]
            if self.fit_bias:
                b[:] = done[0][1]
        elif done:
            K.sum_parts(np.stack([d[0] for d in done]), np.stack([d[1] for d in done]), 0,
                        self.n_items, self.fit_bias, V, b)

    def v_step(self, V: np.ndarray, b: np.ndarray, seed) -> None:
        """One stratified epoch: the rounds in the order the seed draws; every worker runs
        its tasks round after round, blocks passing from worker to worker
        (:meth:`UserShard.epoch`), and the driver waits once, for the last round's blocks."""
        run = self.run
        if not self.features_sent:   # U_old of every user, once per outer iteration
            rows = [run.call(w, "u_old") for w in self.workers]
            run.get([run.call(w, "set_features", *rows) for w in self.workers])
            self.features_sent = True
        order, bs = self.item_order, self.block_start
        V_t, b_t = V[order], b[order]
        rounds = np.empty(self.round_ptr.shape[0] - 1, dtype=np.int64)
        K.epoch_rounds(rounds, seed)
        calls = [run.call(w, "epoch", rounds, int(seed),
                          {p: (V_t[bs[p]:bs[p + 1]], b_t[bs[p]:bs[p + 1]])
                           for p in self.plans[k]["blocks"][rounds[0]]})
                 for k, w in enumerate(self.workers)]
        for last in run.get(calls):
            for p, (V_p, b_p) in last.items():
                V_t[bs[p]:bs[p + 1]], b_t[bs[p]:bs[p + 1]] = V_p, b_p
        V[order], b[order] = V_t, b_t
        self.beta_moved = True

    def users_objective(self, V: np.ndarray, b: np.ndarray) -> float:
        run = self.run
        V_ref, b_ref = run.put(V), run.put(b)
        shares = np.empty((self.n_users, 2))   # summed as one process sums its column
        shares[:, 0] = np.concatenate(run.get([run.call(w, "users_objective", V_ref, b_ref)
                                               for w in self.workers]))
        return float(shares[:, 0].sum())

    def u_step(self, V: np.ndarray, b: np.ndarray, seed) -> tuple[float, float]:
        run = self.run
        V_ref, b_ref = run.put(V), run.put(b)
        shares = np.concatenate(run.get([run.call(w, "u_step", V_ref, b_ref, int(seed))
                                         for w in self.workers]))
        return float(shares[:, 0].sum()), float(shares[:, 1].sum())

    def result(self) -> tuple:
        """(U, alpha, beta) gathered in user order."""
        self._pull_beta()
        run = self.run
        parts = run.get([run.call(w, "result") for w in self.workers])
        self.peak_rss = run.get([run.call(w, "peak_rss") for w in self.workers])
        return tuple(np.concatenate([p[i] for p in parts]) for i in range(3))


def solve_on_workers(cols: np.ndarray, n_users: int, n_items: int, state: dict | None, *,
                     rank: int, reg: float, loss: str, fit_bias: bool, max_iter: int,
                     tol: float, rng, n_workers: int, runner=None,
                     verbose: bool = False) -> tuple[S.Result, int, list]:
    """:func:`solvers._altsvm_solver.solve` with :class:`RayWork` on ``n_workers`` workers:
    ``cols`` the comparisons in layout order (a (3, n) array sorted by user, stably), the
    start cold (U drawn here from ``rng``, as :func:`~solvers._altsvm_solver.cold_start`
    draws it) or from the warm ``state``. Returns the result, the warm join's matches and
    each worker's peak resident memory (bytes; in process: this process's)."""
    runner = runner or InProcess()
    try:
        work = RayWork(cols, n_users, n_items, rank, reg, S.LOSSES[loss], fit_bias,
                       n_workers, runner)
        V, b = np.zeros((n_items, rank)), np.zeros(n_items)
        matched = 0
        if state is None:
            work.start(rng.random((n_users, rank)) / np.sqrt(max(rank, 1)))
        else:
            V[: state["V"].shape[0]] = state["V"]
            if fit_bias:
                b[: state["b"].shape[0]] = state["b"]
            matched = work.warm(state, V, np.inf if loss == "squared_hinge" else 1.0)
        start = S.Start(None, V, b, None, None, warm=state is not None, n_matched=matched)
        res = S.solve(None, start, reg=reg, loss=loss, fit_bias=fit_bias, max_iter=max_iter,
                      tol=tol, rng=rng, parallel=False, verbose=verbose, work=work)
    finally:
        runner.close()     # the workers end with the fit (or its failure)
    return res, matched, work.peak_rss
