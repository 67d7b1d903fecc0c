"""AltSVM's comparisons from a dataset's met rows: implicit ("a met item beats a sampled unmet
one") and explicit (pairs of ratings), under the per-user caps and one fit's budget
(:func:`within_budget`). The dataset builder (:func:`.altsvm_data.collaborative`), the trainer,
its tuning and the fold-in spec all make or size them here, the same bits for the same rows,
parameters and seed in any process.
"""

from __future__ import annotations

import zlib

import numpy as np

from pipeline.serving.layout import key_of
from pipeline.training.datasets import TEST, TRAIN, VALIDATION
from pipeline.training.trainers.altsvm_metrics import relevance_of


def check_caps(params: dict) -> None:
    """Refuse a per-item cap or a comparison budget that is not a whole number >= 0 (read
    with the config, not after a window was built)."""
    for name in ("implicit_max_per_positive", "implicit_max_comparisons"):
        value = params.get(name, 0)
        if type(value) is not int or value < 0:
            raise ValueError(f"{name} is {value!r}, expected a whole number >= 0 (0: no cap)")


def make_comparisons(u, i, r, n_items: int, *, explicit=None, comparisons: str = "implicit",
                     implicit_per_item: int = 10, implicit_sampling: str = "uniform",
                     implicit_per_user: int = 0, implicit_min_rating: float = 0.0,
                     implicit_max_per_positive: int = 0, implicit_max_comparisons: int = 0,
                     max_pairs_per_user: int | None = None, user_ids=None, seed: int = 0,
                     loser_counts=None) -> tuple[np.ndarray, dict]:
    """Comparisons (user, winner, loser) of met rows ``(u, i, r)`` (NaN rating: an
    interaction), as :func:`.altsvm_data.collaborative` describes, and how many each kind dropped
    (``implicit_budget``: those :func:`within_budget` left out). ``user_ids[u]`` is user
    ``u``'s id: a user's rating pairs past ``max_pairs_per_user`` are chosen by a hash of their
    key (:func:`user_salts`), as the refresher chooses them. Popularity-sampled losers are
    drawn by ``loser_counts`` (:func:`loser_counts`) when given."""
    from solvers.pairs import implicit_comparisons, pairs_from_ratings

    made, dropped = [], {}
    if comparisons in ("explicit", "mixed"):
        rated = np.isfinite(r)
        salts = (user_salts(user_ids, u[rated])
                 if max_pairs_per_user and user_ids is not None else None)
        pairs = pairs_from_ratings(u[rated], i[rated], r[rated],
                                   max_pairs_per_user=max_pairs_per_user, random_state=seed,
                                   user_salts=salts)
        dropped["explicit"] = _pairs_possible(u[rated], r[rated]) - len(pairs)
        made += [pairs] + ([explicit] if explicit is not None else [])
    if comparisons in ("implicit", "mixed"):
        wins = ~(r < implicit_min_rating)          # NaN (an interaction) wins
        per_user = implicit_per_user or 0
        positives = np.bincount(u[wins])
        positives = positives[positives > 0]
        wanted = implicit_asked(positives, per_user, implicit_max_per_positive,
                                implicit_per_item)
        cap, per_item = within_budget(positives, per_user, implicit_max_per_positive,
                                      implicit_per_item, implicit_max_comparisons)
        imp = implicit_comparisons(u, i, max(n_items, 1), per_item, implicit_sampling,
                                   max_per_user=max_pairs_per_user, random_state=seed,
                                   positive=wins, per_user=per_user or None,
                                   max_per_positive=cap or None, popularity=loser_counts)
        asked = implicit_asked(positives, per_user, cap, per_item)
        if asked < wanted:
            dropped["implicit_budget"] = wanted - asked
        dropped["implicit"] = asked - len(imp)
        made.append(imp)
    if not made:
        return np.zeros((0, 3), np.int32), dropped
    out = made[0] if len(made) == 1 else np.concatenate(made)
    # int32 while the ids fit (the solver takes them as they are): 12 bytes a comparison, not 24
    fits = out.size == 0 or int(out.max()) < 2**31
    return (out.astype(np.int32) if fits else out), dropped


LOSER_DRIFT = 0.1   # popularity counts are counted afresh once this share of their mass moved


def loser_counts(items_met: np.ndarray, n_items: int, last: dict | None
                 ) -> tuple[np.ndarray, float]:
    """``(counts, drift)``: the counts popularity-sampled losers are drawn
    by (:func:`solvers.pairs.implicit_comparisons`'s ``popularity``), and how far the data's
    own moved from them. ``items_met`` are the items of a dataset's TRAIN + VALIDATION rows
    (one per (user, item): a count is how many users met the item).

    ``last`` (the last dataset's arrays) hands its counts on while the data's own are within
    ``LOSER_DRIFT`` of them in total variation, ½ Σ_j |p_j − q_j| of the two normalized: a
    loser depends on every item's count, so counts taken afresh on 2% more events of a Zipf
    set moved 81% of its comparisons and a warm start found few of its duals; kept, 5%.
    Growth alone moves little mass when the tastes stay, and a sliding window's drift is
    caught when it adds up, so the counts follow the data in steps of at most 10%."""
    own = np.bincount(items_met, minlength=n_items).astype(np.int64)
    if last is None or "loser_counts" not in last:
        return own, 0.0
    kept = np.zeros(n_items, np.int64)
    known = min(n_items, len(last["loser_counts"]))
    kept[:known] = np.asarray(last["loser_counts"])[:known]
    drift = 0.5 * float(np.abs(own / max(own.sum(), 1) - kept / max(kept.sum(), 1)).sum())
    return (kept if drift <= LOSER_DRIFT else own), drift


def user_salts(user_ids, users: np.ndarray) -> np.ndarray:
    """The salt of each of ``users`` (indices into ``user_ids``; 0 for the others) that the
    stable choice of a user's rating pairs hashes: the CRC-32 of the user's key
    (:func:`pipeline.serving.layout.key_of`), which the refresher knows without training's
    numbering of users."""
    salts = np.zeros(len(user_ids), np.uint64)
    for n in np.unique(users):
        salts[n] = zlib.crc32(key_of(user_ids[n]).encode())
    return salts


def implicit_asked(positives: np.ndarray, per_user: int, cap: int, per_item: int) -> int:
    """How many implicit comparisons users with ``positives`` liked rows each ask for: each
    ``min(per_user, positives · cap)`` (cap 0: per_user) with a per-user budget, else
    ``per_item`` per liked row."""
    if per_user:
        return int(np.minimum(per_user, positives.astype(np.int64) * (cap or per_user)).sum())
    return int(positives.sum()) * int(per_item)


def within_budget(positives: np.ndarray, per_user: int, cap: int, per_item: int,
                  budget: int) -> tuple[int, int]:
    """``(cap, per_item)`` lowered as little as it takes for :func:`implicit_asked` to stay
    within ``budget`` comparisons (0: no budget), at least 1 per liked row: the fit's memory
    (about 130 bytes per comparison) is then bounded whatever the data's size. With a per-user
    budget the cap per liked row is lowered (the largest that fits), else ``per_item``.

    >>> within_budget(np.array([10, 100]), 1000, 10, 10, 500)   # asks 100 + 1000 = 1,100
    (4, 10)
    >>> within_budget(np.array([10, 100]), 0, 0, 10, 500)       # asks 110 x 10
    (0, 4)
    """
    if not budget or implicit_asked(positives, per_user, cap, per_item) <= budget:
        return cap, per_item
    if not per_user:
        return cap, max(1, int(budget) // max(1, int(positives.sum())))
    lo, hi = 1, int(cap or per_user)         # the largest cap in [1, hi] within the budget
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if implicit_asked(positives, per_user, mid, per_item) <= budget \
            else (lo, mid - 1)
    return lo, per_item


def training_comparisons(arrays: dict, param, parts, seed: int) -> np.ndarray:
    """The comparisons of the met rows in ``parts`` (and, with explicit ones, the comparison
    events), made as :func:`collaborative` makes them; ``param(name)`` is the dataset
    parameter ``name`` (the config's, or a tuned value). The same bits for the same rows,
    parameters and seed, in any process."""
    rows = np.isin(arrays["met_part"], parts)
    min_rating = param("implicit_min_rating")
    if min_rating == "relevance":
        min_rating = float(arrays["relevance"])
    return make_comparisons(
        arrays["met_user"][rows], arrays["met_item"][rows], arrays["met_rating"][rows],
        len(arrays["item_ids"]), explicit=arrays.get("comparison_events"),
        comparisons=param("comparisons"), implicit_per_item=int(param("implicit_per_item")),
        implicit_sampling=param("implicit_sampling"),
        implicit_per_user=int(param("implicit_per_user")),
        implicit_min_rating=float(min_rating),
        implicit_max_per_positive=int(param("implicit_max_per_positive")),
        implicit_max_comparisons=int(param("implicit_max_comparisons")),
        max_pairs_per_user=param("max_pairs_per_user") or None, user_ids=arrays["user_ids"],
        seed=seed, loser_counts=arrays.get("loser_counts"))[0]


def budget_caps(arrays: dict, param, parts) -> tuple[int, int]:
    """``(implicit_max_per_positive, implicit_per_item)`` as :func:`training_comparisons`
    applies them to the met rows in ``parts`` (:func:`within_budget`): what a user folded into
    that fit gets too."""
    cap, per_item = int(param("implicit_max_per_positive") or 0), int(param("implicit_per_item"))
    if not int(param("implicit_max_comparisons") or 0):
        return cap, per_item
    rows = np.isin(arrays["met_part"], parts)
    min_rating = param("implicit_min_rating")
    if min_rating == "relevance":
        min_rating = float(arrays["relevance"])
    wins = ~(arrays["met_rating"][rows] < float(min_rating))
    positives = np.bincount(arrays["met_user"][rows][wins])
    return within_budget(positives[positives > 0], int(param("implicit_per_user") or 0), cap,
                         per_item, int(param("implicit_max_comparisons")))


def _pairs_possible(users: np.ndarray, ratings: np.ndarray) -> int:
    """Within-user pairs with different ratings, over all users: Σ_u (n_u² − Σ_r n_ur²) / 2."""
    if len(users) == 0:
        return 0
    _, per_user = np.unique(users, return_counts=True)
    _, per_rating = np.unique(np.column_stack([users, ratings]), axis=0, return_counts=True)
    return int((np.sum(per_user.astype(np.int64) ** 2)
                - np.sum(per_rating.astype(np.int64) ** 2)) // 2)


def fold_in_spec(model, arrays: dict, cfg, family, tuned: dict) -> dict:
    """How a new user is folded in (``{}`` for what is not a fitted AltSVM): the pairwise
    problem with λ and loss of ``model``, implicit comparisons ``per_item`` per met item or
    ``per_user`` in all (training's ``implicit_per_user``; ``tuned``: this run's choice, where
    it tuned one), losers drawn as training's (``sampling``; by popularity, by the counts the
    artifact publishes: the dataset's ``loser_counts``), and what the dataset used to derive a
    user's inputs from their events: ``relevance`` (the resolved threshold), ``min_rating``
    (the rating an item needs to win a comparison), ``comparisons`` (the mode) and
    ``rating_range``."""
    if not hasattr(model, "reg_"):
        return {}
    params = {**cfg.params, **tuned}
    param = lambda name: family.dataset_param(params, name)   # noqa: E731
    relevance = relevance_of(arrays, cfg)
    min_rating = param("implicit_min_rating")
    range_ = param("rating_range")
    # the published fit's caps (every met row's; implicit_max_comparisons may lower them)
    cap, per_item = budget_caps(arrays, param, (TRAIN, VALIDATION, TEST))
    spec = {"method": "pairwise", "reg": float(model.reg_), "loss": model.loss,
            "per_item": per_item, "sampling": param("implicit_sampling"),
            "relevance": relevance,
            "min_rating": relevance if min_rating == "relevance" else float(min_rating),
            "comparisons": param("comparisons"),
            "rating_range": None if range_ is None else [float(x) for x in range_]}
    if int(param("implicit_per_user") or 0) > 0:
        spec["per_user"] = int(param("implicit_per_user"))
        if cap > 0:
            spec["max_per_positive"] = cap
    if param("max_pairs_per_user"):         # each kind's cap; rating pairs by the seed
        spec.update(max_pairs_per_user=int(param("max_pairs_per_user")),
                    seed=int(cfg.evaluation["seed"]))
    return spec
