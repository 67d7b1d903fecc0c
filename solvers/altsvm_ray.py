"""AltSVM on a Ray cluster: the one-process fit, bit for bit, with its comparisons on workers.

Who holds what. The users are cut into W contiguous ranges of about equal comparisons, one per
worker (a Ray actor, :class:`UserShard`). A worker lays its users' comparisons out as one
process does (by user, then as given), and holds their duals alpha and beta, their rows of U
and U_old, and runs their U-step; each user draws from the random stream of its global number.
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
        import ray

        from solvers.ray_loopback import is_loopback, keep_loopback

        if not ray.is_initialized():
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


# ---------------------------------------------------------------------- a worker


def is_worker_failure(err: BaseException) -> bool:
    """Whether ``err`` says a worker process or node died (what starting again fixes), not
    that a call failed in our code."""
    try:
        from ray import exceptions as rx
    except ImportError:
        return False
    return isinstance(err, (rx.RayActorError, rx.WorkerCrashedError, rx.ObjectLostError,
                            rx.NodeDiedError)) and not isinstance(err, rx.RayTaskError)


def _one_thread(method):
    """Run ``method`` with numba on one thread: a worker has one CPU, and numba's thread count
    is per calling thread (an actor runs its calls on several)."""
    import functools

    @functools.wraps(method)
    def run(self, *args):
        import numba

        numba.set_num_threads(1)
        return method(self, *args)
    return run


def _writable(a) -> np.ndarray:
    """A C-ordered, writable float64 copy (an array from Ray's object store is read-only, and
    numba compiles read-only arrays apart)."""
    return np.array(a, dtype=np.float64, order="C", copy=True)


class UserShard:
    """Users ``lo .. hi − 1``: their comparisons, duals, rows of U and U-step; and the V-step
    tasks dealt to this worker (see the module)."""

    @_one_thread
    def __init__(self, lo: int, hi: int, users, winners, losers, n_items: int, rank: int,
                 reg: float, loss_code: int, fit_bias: bool):
        self.lo, self.hi, self.n_items = int(lo), int(hi), int(n_items)
        self.reg, self.loss, self.fit_bias = float(reg), int(loss_code), bool(fit_bias)
        dtype = np.asarray(winners).dtype
        self.lay = S.layout((np.asarray(users, dtype=dtype) - dtype.type(lo),
                             np.asarray(winners), np.asarray(losers)), self.hi - self.lo,
                            self.n_items)
        n = self.lay["cu"].shape[0]
        self.alpha, self.beta = np.zeros(n), np.zeros(n)
        self.U = np.zeros((self.hi - self.lo, rank))
        self.U_old = self.U.copy()
        self.shares = np.empty((self.hi - self.lo, 2))
        self.to_owner: dict = {}     # owner -> our layout positions of its tasks, in its order

    # -- sizes the driver plans with
    def entries(self) -> np.ndarray:
        return np.diff(self.lay["entry_ptr"])

    def degrees(self) -> np.ndarray:
        lay = self.lay
        return (np.bincount(lay["cw"], minlength=self.n_items)
                + np.bincount(lay["cl"], minlength=self.n_items))

    def task_sizes(self, item_block, n_blocks: int) -> np.ndarray:
        """Comparisons per block pair key min(p, q)·B + max(p, q) (each comparison's key is
        kept for :meth:`task_rows`)."""
        item_block = np.asarray(item_block)
        bw, bl = item_block[self.lay["cw"]], item_block[self.lay["cl"]]
        self.keys = np.minimum(bw, bl).astype(np.int32) * np.int32(n_blocks) + np.maximum(bw, bl)
        return np.bincount(self.keys, minlength=n_blocks * n_blocks)

    # -- the starting point
    def set_u(self, U) -> None:
        self.U = _writable(U)
        self.U_old = self.U.copy()

    @_one_thread
    def join(self, users, winners, losers, alpha, beta, clip_to: float) -> int:
        """Carry the last fit's duals of our users onto our comparisons (warm start)."""
        (self.alpha, self.beta), matched = S.join_duals(
            np.asarray(users) - self.lo, np.asarray(winners), np.asarray(losers),
            (alpha, beta), self.lay, clip_to=clip_to)
        return matched

    @_one_thread
    def users_from_duals(self, V) -> None:
        lay = self.lay
        K.users_from_duals(lay["blocks"], lay["user_ptr"], lay["pos_w"], lay["pos_l"],
                           lay["entry_ptr"], lay["entry_item"], self.alpha, _writable(V),
                           self.reg, self.U)
        self.U_old = self.U.copy()

    # -- the V-step's tasks: rows for their owners, and as their owner
    def task_rows(self, owner: int, tasks, task_of_key, item_new):
        """Our comparisons of ``tasks`` (task after task, each in our layout order) for the
        worker ``owner``: (count per task, users, relabelled winners and losers, beta)."""
        if getattr(self, "task", None) is None:      # each comparison's task, once
            self.task, self.keys = np.asarray(task_of_key)[self.keys], None
        task = self.task
        tasks = np.asarray(tasks, dtype=np.int64)
        rank_of = np.full(int(np.asarray(task_of_key).max()) + 1, -1, dtype=np.int64)
        rank_of[tasks] = np.arange(tasks.shape[0])
        mine = rank_of[task]
        picked = np.flatnonzero(mine >= 0)
        # a stable sort by the task's place in ``tasks`` (radix sort on 16-bit keys: the
        # tasks number at most B(B+1)/2 = 2,080)
        picked = picked[np.argsort(mine[picked].astype(np.int16), kind="stable")]
        self.to_owner[owner] = picked
        lay, item_new = self.lay, np.asarray(item_new)
        return (np.bincount(mine[picked], minlength=tasks.shape[0]),
                (lay["cu"][picked] + lay["cu"].dtype.type(self.lo)).astype(lay["cu"].dtype),
                item_new[lay["cw"][picked]], item_new[lay["cl"][picked]], self.beta[picked])

    def own_tasks(self, plan: dict, *rows) -> None:
        """Become the worker of ``plan["tasks"]`` (grouped by round) from every worker's
        :meth:`task_rows`, in worker order: task after task, each task's comparisons worker
        after worker (by user, as the one-process sort orders them)."""
        self.task_ids = np.asarray(plan["tasks"], dtype=np.int64)
        self.round_ptr = np.asarray(plan["round_ptr"], dtype=np.int64)
        counts = np.stack([r[0] for r in rows]).astype(np.int64)       # workers x tasks
        self.task_ptr = np.zeros(self.task_ids.shape[0] + 1, dtype=np.int64)
        np.cumsum(counts.sum(axis=0), out=self.task_ptr[1:])
        n = int(self.task_ptr[-1])
        before = np.cumsum(counts, axis=0) - counts       # earlier workers' rows of each task
        self.tu = np.empty(n, dtype=rows[0][1].dtype)
        self.tw = np.empty(n, dtype=rows[0][2].dtype)
        self.tl = np.empty(n, dtype=rows[0][2].dtype)
        self.beta_t = np.empty(n)
        self.from_shard = []
        for s, (cnt, tu, tw, tl, beta) in enumerate(rows):
            first = self.task_ptr[:-1] + before[s]        # where its rows of each task go
            within = np.arange(cnt.sum()) - np.repeat(np.cumsum(cnt) - cnt, cnt)
            where = np.repeat(first, cnt) + within
            self.tu[where], self.tw[where], self.tl[where], self.beta_t[where] = tu, tw, tl, beta
            self.from_shard.append(where)
        # each round's items renumbered into the blocks this worker is sent for it, in the
        # plan's order
        block_start = np.asarray(plan["block_start"], dtype=np.int64)
        for rho, blocks in enumerate(plan["blocks"]):
            lo, hi = self.task_ptr[self.round_ptr[rho]], self.task_ptr[self.round_ptr[rho + 1]]
            if hi > lo:
                new = np.full(block_start[-1], -1, dtype=np.int64)
                rows_of = np.concatenate([np.arange(block_start[p], block_start[p + 1])
                                          for p in blocks])
                new[rows_of] = np.arange(rows_of.shape[0])
                self.tw[lo:hi] = new[self.tw[lo:hi]]
                self.tl[lo:hi] = new[self.tl[lo:hi]]
        self.blocks_of_round = plan["blocks"]

    def beta_to(self, owner: int) -> np.ndarray:
        """Our beta of ``owner``'s tasks, in the order :meth:`task_rows` sent them."""
        return self.beta[self.to_owner[owner]]

    def set_beta_t(self, *from_shards) -> None:
        """Our tasks' beta from every worker (:meth:`beta_to`, in worker order)."""
        for s, values in enumerate(from_shards):
            self.beta_t[self.from_shard[s]] = values

    def beta_for(self, shard: int) -> np.ndarray:
        """The beta of the comparisons worker ``shard`` sent, as it sent them."""
        return self.beta_t[self.from_shard[shard]]

    def take_beta(self, *from_owners) -> None:
        """Our beta back from every owner (:meth:`beta_for`, in owner order)."""
        for owner, values in enumerate(from_owners):
            self.beta[self.to_owner[owner]] = values

    def set_features(self, *parts) -> None:
        """U_old of every user (the workers' rows in order): the V-step's features."""
        self.U_full = _writable(np.concatenate(parts)) if parts else np.zeros((0, 0))

    def set_peers(self, me: int, block_worker, *peers) -> None:
        """Every worker (``peers``, in order; this one is ``me``) and the worker of each block
        in each round (``block_worker[rho, p]``): where an epoch sends a block next."""
        import threading

        self.me, self.block_worker, self.peers = me, np.asarray(block_worker), peers
        self.mail, self.mail_ready = {}, threading.Condition()

    def receive(self, q: int, blocks: dict) -> None:
        """Blocks ``{p: (V_p, b_p)}`` for the q-th round of the running epoch."""
        with self.mail_ready:
            for p, block in blocks.items():
                self.mail[q, p] = block
            self.mail_ready.notify_all()

    def _send(self, worker: int, q: int, blocks: dict) -> None:
        """One message per worker and round (a Ray call costs about a millisecond)."""
        peer = self.peers[worker]
        if worker == self.me:
            self.receive(q, blocks)
        elif hasattr(peer.receive, "remote"):
            peer.receive.remote(q, blocks)
        else:
            peer.receive(q, blocks)

    @_one_thread
    def epoch(self, rounds, seed, first: dict) -> dict:
        """Our tasks of one V-step epoch, round after round in the order ``rounds``: each
        round waits for its blocks (``first``: this worker's blocks of the first round, from
        the driver; later ones from the worker of their last task) and sends each block on to
        the worker of its next task; returns the blocks of our tasks in the last round."""
        rounds, seed = np.asarray(rounds, dtype=np.int64), np.uint64(seed)
        self.receive(0, first)
        last = {}
        for q, rho in enumerate(rounds):
            blocks = self.blocks_of_round[rho]
            if not blocks:
                continue
            with self.mail_ready:
                self.mail_ready.wait_for(lambda: all((q, p) in self.mail for p in blocks))
                sent = [self.mail.pop((q, p)) for p in blocks]
            V = _writable(np.concatenate([blk[0] for blk in sent]))
            b = _writable(np.concatenate([blk[1] for blk in sent]))
            K.vstep_strata(np.array([rho], dtype=np.int64), self.round_ptr, self.task_ptr,
                           self.task_ids, self.tu, self.tw, self.tl, self.beta_t, self.U_full,
                           V, b, self.fit_bias, self.reg, self.loss, seed)
            cuts = np.cumsum([blk[1].shape[0] for blk in sent])[:-1]
            out = dict(zip(blocks, zip(np.split(V, cuts), np.split(b, cuts))))
            if q + 1 == rounds.shape[0]:
                last = out
                continue
            to = self.block_worker[rounds[q + 1]]
            for worker in sorted({int(to[p]) for p in blocks}):
                self._send(worker, q + 1, {p: blk for p, blk in out.items() if to[p] == worker})
        return last

    # -- the users' side of the alternation
    def swap(self) -> None:
        self.U, self.U_old = self.U_old, self.U

    def undo_u_step(self) -> None:
        self.U[:] = self.U_old

    def u_old(self) -> np.ndarray:
        return self.U_old

    @_one_thread
    def users_objective(self, V, b) -> np.ndarray:
        lay = self.lay
        K.user_shares(lay["blocks"], lay["user_ptr"], lay["pos_w"], lay["pos_l"],
                      lay["entry_ptr"], lay["entry_item"], self.U, _writable(V), _writable(b),
                      self.reg, self.loss, self.shares[:, 0])
        return self.shares[:, 0].copy()

    @_one_thread
    def u_step(self, V, b, seed) -> np.ndarray:
        lay = self.lay
        K.ustep_serial(lay["blocks"], lay["user_ptr"], lay["cw"], lay["cl"], lay["pos_w"],
                       lay["pos_l"], lay["entry_ptr"], lay["entry_item"], self.alpha,
                       self.U_old, _writable(V), _writable(b), self.reg, self.loss,
                       S.MAX_EXTRA_U_EPOCHS, np.uint64(seed), self.lo, self.U, self.shares)
        return self.shares.copy()

    @_one_thread
    def part_sum(self, lo: int, hi: int, *so_far):
        """Users ``lo .. hi − 1`` (global numbers) of a part of the V rebuild, summed in order
        from zero, or onto ``so_far`` (the part's sum over the users before them)."""
        lay, r = self.lay, self.U.shape[1]
        lo, hi = lo - self.lo, hi - self.lo
        if so_far:
            V, b = _writable(so_far[0][0]), _writable(so_far[0][1])
            K.add_users(lo, hi, lay["user_ptr"], lay["pos_w"], lay["pos_l"], lay["entry_ptr"],
                        lay["entry_item"], self.beta, self.U_old, self.reg, self.fit_bias, V, b)
        else:
            V, b = np.empty((self.n_items, r)), np.zeros(self.n_items)
            K._rebuild_part(lo, hi, lay["user_ptr"], lay["pos_w"], lay["pos_l"],
                            lay["entry_ptr"], lay["entry_item"], self.beta, self.U_old,
                            self.reg, self.fit_bias, V, b)
        return V, b

    def result(self) -> tuple:
        return self.U, self.alpha, self.beta

    def peak_rss(self) -> int:
        """This worker's peak resident memory, bytes."""
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


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
