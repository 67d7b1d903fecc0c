"""The round trips of ``TopK.recommend``: users' precomputed lists (one round trip), and for
the users those do not answer, their factor and seen items (one more).

One round trip per answer from a precomputed list: ``MGET <bucket pointer> <list key>`` with
the version this process last saw; the user's bucket pointer and list share a hash tag (one
slot, one node of a cluster), and ``MGET`` is atomic, so when the returned pointer names that
version the list belongs to it. When the pointer names another version, the version is
resolved again (its item ids loaded once: they are immutable per version) and the lists read
again. A batch asks every bucket it touches (one ``MGET`` on a single Redis, one per bucket
pipelined per node on a cluster) and answers only when every pointer names the same version.
``REDIS_LAYOUT.md`` has the argument why no answer mixes versions.

Users with a factor but no precomputed list (or ``k`` beyond the precomputed length, or a
filter that leaves fewer than ``k``) are scored on demand from their factor and the version's
item factors (read once per version); unknown users get the version's fallback list. The
answers themselves come from :mod:`~pipeline.serving.answer_builders`.
"""

from __future__ import annotations

from pipeline.serving import answer_builders as build
from pipeline.serving.answers import Recommendation
from pipeline.serving.fallback import Guard
from pipeline.serving.item_filter import ItemFilter
from pipeline.serving.layout import BUCKETS, bucket_of, key_of
from pipeline.serving.resolver import VersionResolver
from pipeline.serving.transport import Down, Transport
from pipeline.serving.version_cache import VersionState, load_factors, load_global_scores


class ListReads:
    """Reads of users' lists for one lookup client; failures go to ``guard``."""

    def __init__(self, transport: Transport, versions: VersionResolver, guard: Guard):
        self.transport, self.versions, self.guard = transport, versions, guard
        self.outage, self.policy = guard.outage, guard.policy

    def one(self, model: str, user, k: int) -> Recommendation:
        """A user's precomputed list of the version last seen, or a global list."""
        st = self.versions.current.get(model)
        if st is not None and not self.outage.active:
            if st.per_key and user is not None and 0 <= k and (k <= st.top_k or not st.rank):
                key = user if type(user) is str else key_of(user)
                b = bucket_of(key)
                try:
                    ptr, value, fresh = self.transport.send(st.keys, b, [
                        ("MGET", st.pointer_keys[b], st.topk_prefixes[b] + key,
                         st.fresh_prefixes[b] + key)])[0]
                except Down as down:
                    return self.guard.answers(model, [user], k, down.err)[0]
                if value is not None and ptr is not None and ptr.startswith(st.pointer_prefix):
                    rec = build.precomputed(st, user, value, k, key, fresh)
                    if self.policy.remembers:
                        self.policy.remember(model, key, rec)
                    return rec
            elif not st.per_key:
                try:
                    cur = self.transport.send(st.keys, BUCKETS, [("GET", st.keys.current)])[0]
                except Down as down:
                    return self.guard.answers(model, [user], k, down.err)[0]
                if st.names(cur):
                    return build.global_answer(st, user, self.global_items(st, k, None))
        return self.resolve(model, [user], k)[0]

    def many(self, model: str, users, k: int) -> list[Recommendation]:
        """Precomputed lists of a batch of users, one round trip per node."""
        users = list(users)
        st = self.versions.current.get(model)
        if not users:
            return []
        if (st is not None and st.per_key and not self.outage.active and 0 <= k
                and (k <= st.top_k or not st.rank) and None not in users):
            keys = [u if type(u) is str else key_of(u) for u in users]
            buckets = [bucket_of(x) for x in keys]
            try:
                pointers, values, _ = self.transport.bucket_mget(
                    st, buckets, _list_and_fresh(st, buckets, keys), 2)
            except Down as down:
                return self.guard.answers(model, users, k, down.err)
            first = pointers[0]       # synced pointers are equal bytes: one C-level count
            lists = values[0::2]
            if ((first is not None and first.startswith(st.pointer_prefix)
                 and pointers.count(first) == len(pointers) or all(map(st.names, pointers)))
                    and None not in lists):
                out = [build.precomputed(st, u, v, k, x, f)
                       for u, x, v, f in zip(users, keys, lists, values[1::2])]
                if self.policy.remembers:
                    for x, rec in zip(keys, out):
                        self.policy.remember(model, x, rec)
                return out
        return self.resolve(model, users, k)

    # ------------------------------------------------------------------ resolve, then read
    def resolve(self, model: str, users: list, k: int) -> list[Recommendation]:
        """Answers for ``users`` after resolving ``current`` (the version may have changed;
        the policy's answers when Redis is down)."""
        build.check_k(k)

        def attempt():
            out = self._resolve_once(model, users, k)
            if self.policy.remembers:
                for u, rec in zip(users, out):
                    if rec.user is not None:
                        self.policy.remember(model, key_of(u), rec)
            return out

        return self.guard.run(model, attempt,
                              lambda err, again: self.guard.answers(model, users, k, err, again))

    def filtered(self, model: str, users: list, k: int, exclude, allow) -> list:
        """Filtered answers from one version (last-known ones, filtered, when Redis is down)."""
        build.check_k(k)

        def attempt():
            st = self.versions.current_state(model)
            return self._resolve_once(model, users, k, ItemFilter(st, exclude, allow))

        def failed(err, again):
            out = self.guard.answers(model, users, max(k, 1000), err, again)
            return build.filtered_last_known(out, k, exclude, allow)

        return self.guard.run(model, attempt, failed)

    def _resolve_once(self, model: str, users: list, k: int,
                      filt: ItemFilter | None = None) -> list[Recommendation]:
        st = self.versions.current.get(model)
        if st is None or not st.per_key:
            st = self.versions.current_state(model)
        if not st.per_key:
            return [build.global_answer(st, u, self.global_items(st, k, filt)) for u in users]
        if None in users:   # no user given: the version's list for everyone (the fallback)
            known = [i for i, u in enumerate(users) if u is not None]
            answers = (self._resolve_once(model, [users[i] for i in known], k, filt)
                       if known else [])
            out = [build.everyone_answer(st, None, self.global_items(st, k, filt))
                   for _ in users]
            for i, rec in zip(known, answers):
                out[i] = rec
            return out
        names = [key_of(u) for u in users]
        buckets = [bucket_of(x) for x in names]
        pointers, values, _ = self.transport.bucket_mget(
            st, buckets, _list_and_fresh(st, buckets, names), 2)
        self.versions.check_pointers(st, pointers)
        lists, marks = values[0::2], values[1::2]
        out = [build.listed_enough(st, u, v, k, x, filt, f)
               for u, v, x, f in zip(users, lists, names, marks)]
        need = [i for i, rec in enumerate(out) if rec is None]
        if need:
            self._answer_rest(st, users, names, buckets, lists, marks, need, k, out, filt)
        return out

    def _answer_rest(self, st: VersionState, users, names, buckets, lists, marks, need, k,
                     out, filt: ItemFilter | None) -> None:
        """Users the stored list did not answer: their factor, seen items and ``fresh``
        marker (and whether a missing list's key exists) in one more round trip, then scored
        or the fallback."""
        extra = [(buckets[i], ("EXISTS", st.topk_prefixes[buckets[i]] + names[i]))
                 for i in need if lists[i] is None]
        factors: list = [None] * (3 * len(need))
        if st.rank:
            rest = [buckets[i] for i in need]
            pointers, factors, exists = self.transport.bucket_mget(
                st, rest, [n for i, b in zip(need, rest) for n in
                           (st.user_prefixes[b] + names[i], st.seen_prefixes[b] + names[i],
                            st.fresh_prefixes[b] + names[i])],
                3, extra)
            self.versions.check_pointers(st, pointers)
        else:
            exists = self.transport.send_many(st.keys, extra) if extra else []
        exists = iter(exists)
        scored = [f is not None for f in factors[0::3]]
        V = self.factors(st) if any(scored) else None
        fallback = (self.global_items(st, k, filt) if any(
            lists[i] is None and not s for i, s in zip(need, scored)) else [])
        for j, i in enumerate(need):
            out[i] = build.second_answer(
                st, users[i], names[i], buckets[i], lists[i],
                lists[i] is None and bool(next(exists)), factors[3 * j], factors[3 * j + 1], k,
                filt, V, list(fallback), factors[3 * j + 2] if scored[j] else marks[i])

    def factors(self, st: VersionState):
        """The version's item factors and bias (read once per version)."""
        return load_factors(self.transport.bulk, st)

    def global_items(self, st: VersionState, k: int, filt: ItemFilter | None) -> list:
        """The version's list for everyone, filtered, ``k`` long whenever ``k`` items are
        eligible (the per-item global scores read when the stored list runs short)."""
        scores = (load_global_scores(self.transport.bulk, st)
                  if build.global_needs_scores(st, k, filt) else None)
        return build.ranked_global(st, k, filt, scores)


def _list_and_fresh(st: VersionState, buckets: list[int], names: list[str]) -> list[str]:
    """Each user's list key and ``fresh`` marker key, in this order, user after user."""
    topk, fresh = st.topk_prefixes, st.fresh_prefixes
    out: list = [None] * (2 * len(names))
    out[0::2] = [topk[b] + x for b, x in zip(buckets, names)]
    out[1::2] = [fresh[b] + x for b, x in zip(buckets, names)]
    return out
