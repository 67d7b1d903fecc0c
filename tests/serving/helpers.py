"""Small models and plain-numpy reference answers for the serving tests."""

from __future__ import annotations

import numpy as np

from pipeline.serving.artifact import ModelArtifact


def user_model(seed: int = 0, n_users: int = 60, n_items: int = 80, rank: int = 6,
               max_seen: int = 12, str_ids: bool = False, **kw) -> ModelArtifact:
    """A random user_item artifact with bias and seen items (no exact score ties)."""
    rng = np.random.default_rng(seed)
    nnz = rng.integers(0, min(max_seen, n_items - 1) + 1, n_users)
    indptr = np.concatenate([[0], np.cumsum(nnz)])
    indices = np.concatenate([rng.choice(n_items, c, replace=False) for c in nnz]
                             + [np.zeros(0, int)])
    users = [f"user-{i}" for i in range(n_users)] if str_ids else np.arange(n_users) * 10 + 1
    items = [f"item-{i}" for i in range(n_items)] if str_ids else np.arange(n_items) * 7 + 100
    return ModelArtifact.user_item(
        user_ids=users, item_ids=items,
        user_factors=rng.standard_normal((n_users, rank)),
        item_factors=rng.standard_normal((n_items, rank)),
        item_bias=rng.standard_normal(n_items), seen=(indptr, indices), algorithm="test",
        metrics={"seed": seed}, **kw)


def reference_user(art: ModelArtifact, row: int, k: int) -> list:
    """Top k (item id, float32 score) of user ``row``, by numpy argsort."""
    scores = art.user_factors[row] @ art.item_factors.T + art.item_bias
    scores = scores.astype(np.float32)
    seen = art.seen_indices[art.seen_indptr[row]:art.seen_indptr[row + 1]]
    scores[seen] = -np.inf
    order = np.argsort(-scores, kind="stable")[:k]
    order = order[np.isfinite(scores[order])]
    return [(art.item_ids[i].item(), float(scores[i])) for i in order]


def reference_fallback(art: ModelArtifact, k: int) -> list:
    """The mean user's list (no exclusions), as publish computes the fallback."""
    mean = art.user_factors.mean(axis=0, dtype=np.float64)
    scores = (art.item_factors @ mean + art.item_bias).astype(np.float32)
    order = np.argsort(-scores, kind="stable")[:k]
    return [(art.item_ids[i].item(), float(scores[i])) for i in order]


def reference_global(item_ids, scores, k: int) -> list:
    scores = np.asarray(scores, dtype=np.float32)
    order = np.argsort(-scores, kind="stable")[:k]
    return [(np.asarray(item_ids)[i].item(), float(scores[i])) for i in order]


def same_answer(got: list, expected: list, rtol: float = 1e-5) -> bool:
    """Same item ids in the same order, scores equal up to float32 rounding of the matmul."""
    if [i for i, _ in got] != [i for i, _ in expected]:
        return False
    return bool(np.allclose([s for _, s in got], [s for _, s in expected], rtol=rtol,
                            atol=1e-5))
