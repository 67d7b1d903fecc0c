"""A batch's users are folded in in groups of bounded size (``FOLD_IN_ROWS``): the groups
change no bits of any user's factor (a user's answer depends on their own inputs
only), against a real redis-server holding a published AltSVM version."""

from __future__ import annotations

import numpy as np

from pipeline.ingest import synthetic
from pipeline.refresh import refresher as refresher_module
from pipeline.settings import Settings
from tests.refresh import published


def test_folding_a_batch_in_groups_gives_every_user_the_same_bits(tmp_path, redis_url,
                                                                   monkeypatch):
    settings = Settings(home=tmp_path / "home", namespace=f"g{tmp_path.name[-10:]}",
                        redis_url=redis_url)
    events = synthetic.rating_events(n_users=120, n_items=90, per_user=20, seed=4)
    refresher, topk, _ = published(settings, events, tmp_path)
    assert refresher.watch() == "flipped"
    more = synthetic.rating_events(n_users=150, n_items=90, per_user=6, seed=5)   # 30 new
    refresher.apply_events([{**e, "kind": "rating"} for e in more])
    st = refresher.state
    factors = topk.lists.factors(st)
    users = sorted({str(e["user"]) for e in more})

    def fold(rows: int) -> list:
        monkeypatch.setattr(refresher_module, "FOLD_IN_ROWS", rows)
        refresher.last = {}         # each run starts every user from the same place
        return refresher._factors(st, factors, users)

    whole, grouped = fold(10**9), fold(25)      # one call; a group per user or two
    assert len(whole) == len(users) == len(grouped)
    for (user, u, seen), (user_g, u_g, seen_g) in zip(whole, grouped):
        assert user == user_g and np.array_equal(seen, seen_g)
        assert u.tobytes() == u_g.tobytes(), user
