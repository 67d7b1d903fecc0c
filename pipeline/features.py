"""Feature rows shared by training and serving: event features and hashed text, one layout.

A row of a model that takes features and text is ``[features | text]``: columns
``0..n_features-1`` hold the event's ``features`` (a dense list or an ``{index: value}`` map,
indices past ``n_features`` left out and counted), columns ``n_features..`` the hashed text.
The text part is stateless (no vocabulary is learned or stored), so the training job and the
lookup turn the same text into the same vector as long as they agree on ``text_features``: each
word uni- and bigram is hashed (MurmurHash3, scikit-learn's ``HashingVectorizer``) to one of
``text_features`` columns, its count tf becomes 1 + log(tf) and the text's part is scaled to
unit Euclidean norm (an empty text stays all zero). Collisions of rare n-grams in 2**20 columns
cost little accuracy.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

__all__ = ["featurize_text", "feature_rows"]


def featurize_text(texts, n_features=2**20):
    """CSR float32 matrix (len(texts), n_features) of hashed, sublinear-TF, L2-normalised
    word unigrams and bigrams.

    Tokens are scikit-learn's default (runs of 2+ word characters, lower-cased).

    Examples
    --------
    >>> X = featurize_text(["a fine film", "not a fine film at all"], n_features=2**10)
    >>> X.shape, X.dtype.name, round(float(X[0].multiply(X[0]).sum()), 6)
    ((2, 1024), 'float32', 1.0)
    """
    from sklearn.feature_extraction.text import HashingVectorizer
    from sklearn.preprocessing import normalize

    if isinstance(texts, str):
        raise ValueError("texts is one string; pass a list of texts")
    vectorizer = HashingVectorizer(n_features=int(n_features), ngram_range=(1, 2),
                                   alternate_sign=False, norm=None, dtype=np.float32)
    X = vectorizer.transform(texts).tocsr()
    np.log(X.data, out=X.data)
    X.data += 1.0
    return normalize(X, norm="l2", copy=False)


def feature_rows(indices, values, n_features: int, texts=None, text_features: int = 0
                 ) -> tuple[sp.csr_matrix, int]:
    """CSR float32 rows ``[features | text]`` and the number of feature values dropped
    because their index is ``>= n_features``.

    ``indices``/``values`` hold one sequence per row (``None`` or empty: no features);
    ``texts`` one string or ``None`` per row (only read when ``text_features > 0``).

    Examples
    --------
    >>> X, dropped = feature_rows([[0, 5], None], [[1.0, 2.0], None], 3,
    ...                           texts=[None, "good"], text_features=8)
    >>> X.shape, dropped, X[0].toarray().ravel()[:3].tolist()
    ((2, 11), 1, [1.0, 0.0, 0.0])
    """
    n = len(indices)
    lengths = np.array([0 if ix is None else len(ix) for ix in indices], dtype=np.int64)
    present = [i for i in range(n) if lengths[i]]
    cols = np.concatenate([np.asarray(indices[i], dtype=np.int64) for i in present]
                          or [np.zeros(0, np.int64)])
    vals = np.concatenate([np.asarray(values[i], dtype=np.float32) for i in present]
                          or [np.zeros(0, np.float32)])
    rows = np.repeat(np.arange(n), lengths)
    keep = cols < n_features
    X = sp.csr_matrix((vals[keep], (rows[keep], cols[keep])), shape=(n, n_features),
                      dtype=np.float32)
    if text_features:
        T = featurize_text(["" if t is None else t for t in (texts or [None] * n)],
                           text_features)
        X = sp.hstack([X, T], format="csr", dtype=np.float32)
    X.sort_indices()
    return X, int((~keep).sum())
