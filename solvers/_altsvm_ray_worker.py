"""One AltSVM worker of a Ray fit (:mod:`solvers.altsvm_ray` says who holds what and why
the bits are the same): a range of users with their comparisons, duals and rows of U, and
the V-step tasks dealt to it. A plain class: Ray makes it an actor, the unit tests run it in
threads of their own process."""

from __future__ import annotations

import numpy as np

from solvers import _altsvm_kernels as K
from solvers import _altsvm_solver as S


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
