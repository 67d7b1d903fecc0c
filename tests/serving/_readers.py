"""Lookup hammering loop used by the atomicity test, in threads and in spawned processes."""

from __future__ import annotations

import random
import time


def hammer(url: str, model: str, users: list, stop, ready=None, seconds: float = 120.0,
           shared=None):
    """Look up until ``stop`` is set; return (lookups, distinct answers, errors).

    Distinct answers are ``(version, user, source, item ids, scores)`` tuples; a batch whose
    answers come from more than one version is recorded as an error. ``shared``: a TopK used
    by several threads at once (else each call makes its own).
    """
    from contextlib import nullcontext

    from pipeline.serving.lookup import TopK

    rng = random.Random(hash(url) ^ int(time.time() * 1e6))
    seen: set = set()
    errors: list[str] = []
    n = 0
    with nullcontext(shared) if shared is not None else TopK(url, timeout=5.0) as topk:
        if ready is not None:
            ready.set()
        deadline = time.monotonic() + seconds
        while not stop.is_set() and time.monotonic() < deadline:
            try:
                if n % 3 == 2:
                    batch = rng.sample(users, 8)
                    recs = topk.recommend_many(model, batch, k=5)
                    if len({r.version for r in recs}) != 1:
                        errors.append(f"mixed versions in one batch: {[r.version for r in recs]}")
                else:
                    recs = [topk.recommend(model, rng.choice(users), k=5)]
            except Exception as err:  # every failure is a finding
                errors.append(f"{type(err).__name__}: {err}")
                continue
            n += len(recs)
            for r in recs:
                seen.add((r.version, r.user, r.source, tuple(i for i, _ in r.items),
                          tuple(s for _, s in r.items)))
    return n, seen, errors


def main(argv=None) -> int:
    """``python -m tests.serving._readers URL MODEL USERS_JSON DIR``: hammer until ``DIR/stop``
    exists; touch ``DIR/ready.<pid>`` once connected; write ``DIR/result.<pid>.json``.
    (A plain subprocess with files: no pickling between the processes.)"""
    import json
    import os
    import sys
    from pathlib import Path

    url, model, users_json, directory = (argv or sys.argv[1:])[:4]
    users = json.loads(users_json)
    folder = Path(directory)

    class _Stop:
        def is_set(self) -> bool:
            return (folder / "stop").exists()

    class _Ready:
        def set(self) -> None:
            (folder / f"ready.{os.getpid()}").touch()

    n, seen, errors = hammer(url, model, users, _Stop(), _Ready())
    tmp = folder / f".result.{os.getpid()}.json"
    tmp.write_text(json.dumps({"n": n, "seen": [list(x[:3]) + [list(x[3]), list(x[4])]
                                                for x in seen], "errors": errors}))
    tmp.rename(folder / f"result.{os.getpid()}.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
