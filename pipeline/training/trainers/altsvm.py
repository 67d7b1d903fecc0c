"""AltSVM's trainer: rating, interaction and comparison events -> comparisons -> AltSVM (λ chosen
on a warm-started regularization path) -> per-user top-K lists.

Dataset (:func:`.altsvm_data.collaborative`): every (user, item) met, with its part (TRAIN,
VALIDATION or TEST), and the comparisons made from the training parts.

Evaluation measures what is published: each held-out user's top-k over the items not met in
training against their held-out positives (``topk_*``), beside the paper's NDCG over rated
held-out items; the trivial models (popularity, training's wins − losses) likewise. Searches
(:mod:`.altsvm_tuning`, challengers') run on ``tune.sample_users`` users.

**Cost and memory grow with the data.** With P liked (user, item) rows outside the holdout, a
user with p of them gets ``min(implicit_per_user, p · implicit_max_per_positive)`` implicit
comparisons, so C ≤ P · implicit_max_per_positive in all (10 shipped: amazon-beauty's 52k
users with 6 liked items each make 3M, not the 52M of 1,000 per user), lowered to fit
``implicit_max_comparisons`` (20M shipped): the memory below is bounded. Comparisons are made
from the met rows when a fit needs them and handed over in memory, never stored. Peak memory
of the fit: 25 bytes per met row (the dataset) + about 130 per comparison (24 for the rows,
up to 107 more inside the solver, 31 of them kept as its warm state; measured with
tracemalloc at 2M comparisons, rank 20) + 8 · rank · (users + items) per copy of the factors.
"""

from __future__ import annotations

import time
import warnings

import numpy as np

from pipeline.training.datasets import TEST, TRAIN, VALIDATION
from pipeline.training.progress import phase
from pipeline.training.trainers import WARM_PREFIX, Fitted, Trainer, altsvm_tuning, idmap
from pipeline.training.trainers.altsvm_comparisons import (
    check_caps,
    fold_in_spec,
    training_comparisons,
)
from pipeline.training.trainers.altsvm_data import DERIVED, collaborative, tuning_view
from pipeline.training.trainers.altsvm_data import parse_rating_range as parse_range
from pipeline.training.trainers.altsvm_metrics import rated_metrics, relevance_of
from pipeline.training.trainers.altsvm_tuning import MADE, PATH_RATIOS, WARM_STEP
from pipeline.training.trainers.factors import content_key, csr_rows, factors_of, pair_scores
from pipeline.training.tuning import REUSE_GROWTH

HOLDOUT_LISTS_KEPT = 16     # a run's candidates: model, ALS, EASE, blend, two baselines, ...


def _number_or(value, word: str):     # a config value that is a number or the one ``word``
    return value if value == word else float(value)


class AltSVMTrainer(Trainer):
    id_maps, carried, derived = ("user_ids", "item_ids"), ("loser_counts",), DERIVED

    def __init__(self, family):
        super().__init__(family)
        self._holdout_lists: dict = {}    # see topk_lists

    @classmethod
    def check_params(cls, params: dict) -> None:
        parse_range(params.get("rating_range"))
        check_caps(params)

    def build(self, store, cfg, previous: dict | None) -> tuple[dict, dict]:
        ev, made = cfg.evaluation, altsvm_tuning.dataset_axes(cfg, self.family, previous)
        param = altsvm_tuning.param_of(made, self.family, cfg.params)
        data = collaborative(
            store, cfg.kinds, window=cfg.window, users=idmap(previous, "user_ids"),
            items=idmap(previous, "item_ids"), split=ev["split"], holdout=int(ev["holdout"]),
            fraction=float(ev["fraction"]), min_train=int(ev["min_train"]),
            comparisons=param("comparisons"), implicit_per_item=int(param("implicit_per_item")),
            implicit_sampling=param("implicit_sampling"),
            implicit_per_user=int(param("implicit_per_user")),
            implicit_min_rating=_number_or(param("implicit_min_rating"), "relevance"),
            implicit_max_per_positive=int(param("implicit_max_per_positive")),
            implicit_max_comparisons=int(param("implicit_max_comparisons")),
            max_pairs_per_user=param("max_pairs_per_user") or None,
            relevance=_number_or(ev["relevance"], "auto"),
            rating_range=param("rating_range"),
            validation_users=int(cfg.tune.get("sample_users", 0)) if cfg.tune else 0,
            seed=int(ev["seed"]), previous=previous)
        return {**data.to_arrays(), **{MADE + a: np.array(v) for a, v in made.items()}}, {
            "window": data.window.describe(), "stats": data.stats, "n_train": len(data.comparisons)}

    def comparisons(self, arrays: dict, cfg, parts=(TRAIN, VALIDATION)) -> np.ndarray:
        """The comparisons of ``parts`` under the dataset's parameters (TRAIN + VALIDATION) or
        the λ path's (TRAIN), made once per run from the met rows and kept in ``arrays``
        (never in the bundle: :data:`~.altsvm_data.DERIVED`)."""
        name = DERIVED[0] if tuple(parts) == (TRAIN, VALIDATION) else DERIVED[1]
        if name not in arrays:
            made = altsvm_tuning.made_with(arrays, self.family, cfg.params)
            arrays[name] = training_comparisons(arrays, altsvm_tuning.param_of(
                made, self.family, cfg.params), parts, int(cfg.evaluation["seed"]))
        return arrays[name]

    # ------------------------------------------------------------------ fitting

    def fit_model(self, model, arrays: dict, warm: dict | None, cfg) -> dict:
        """:meth:`_fit_model`; a window that gives no training comparison is said as too
        little data (not as the solver's "comparisons is empty")."""
        try:
            return self._fit_model(model, arrays, warm, cfg)
        except ValueError as err:
            if not str(err).startswith("comparisons is empty"):
                raise
            raise ValueError(
                f"too little data to train {cfg.algorithm}: {len(arrays['user_ids']):,} users "
                f"and {len(arrays['met_user']):,} met rows give no training comparison (a user "
                "needs a liked item and another item outside the holdout): ingest more events"
            ) from None

    def _fit_model(self, model, arrays: dict, warm: dict | None, cfg) -> dict:
        """A config with a ``tune`` table: settings chosen on the validation split
        (:mod:`.altsvm_tuning`), or the last run's choice while the data grew little; λ by
        :func:`~.altsvm_tuning.by_ratio`'s rule. A fixed
        ``reg``/``reg_ratio`` from the config is fitted as given. Otherwise λ comes from a
        regularization path scored on the validation split (cold: PATH_RATIOS; warm: the last
        ratio and its neighbours; both paths start cold). A warm run whose comparisons grew
        less than REUSE_GROWTH since the last path skips it: λ stays the last path's λ per
        comparison (the loss is a sum over comparisons, so this keeps its balance with the
        regularizer), and the fit is one warm start. Returns what was learned on the way:
        ``tuning`` (the choice, or how λ was found), ``path`` (the λ path's points),
        ``validated`` (the tuner's factors fitted without the validation rows, for the
        challenger's blend)."""
        sizes = {"n_users": len(arrays["user_ids"]), "n_items": len(arrays["item_ids"])}
        if cfg.tune and "reg" not in cfg.params and "reg_ratio" not in cfg.params:
            learned = {}
            tuning = altsvm_tuning.reuse(model, arrays, cfg, self.family, warm)
            if tuning is None:
                view = tuning_view(arrays)       # the sample of users the search fits
                phase(f"tuning {self.family.name}")
                score = self._validation_score(view, cfg)
                tuning = altsvm_tuning.tune(model, view, cfg, self.family, warm, sizes, score)
                warm = altsvm_tuning.confirm_rank(self._on_cluster(model), arrays, cfg,
                                                  self.family, tuning, sizes, score)
                phase("fit")
                tuning["comparisons"] = altsvm_tuning.final_comparisons(
                    arrays, cfg, self.family, tuning["choice"])
                tuning["path_n"] = len(tuning["comparisons"])
                learned["validated"] = factors_of(tuning.pop("validated"))
            learned["refit_known"] = altsvm_tuning.last_refit_known(warm)
            comparisons = tuning.pop("comparisons")
            arrays[DERIVED[2]] = (np.bincount(comparisons[:, 1], minlength=sizes["n_items"])
                                  - np.bincount(comparisons[:, 2], minlength=sizes["n_items"]))
            if comparisons is not arrays.get(DERIVED[0]):
                arrays.pop(DERIVED[0], None)   # the config's own, not fitted: made again if asked
            if altsvm_tuning.by_ratio(arrays):
                model.reg, model.reg_ratio = None, tuning["reg_ratio"]
            else:
                model.reg = tuning["reg_per_comparison"] * len(comparisons)
            self._on_cluster(model).fit(comparisons, warm_start=warm, **sizes)
            tuning["reg_per_comparison"] = model.reg_ / len(comparisons)   # warm runs keep it
            return {**learned, "tuning": tuning}
        comparisons = self.comparisons(arrays, cfg)
        n = len(comparisons)
        if "reg" in cfg.params or "reg_ratio" in cfg.params \
                or not self.family.dataset_param(cfg.params, "reg_path"):
            self._on_cluster(model).fit(comparisons, warm_start=warm, **sizes)
            return {}
        last = {k: float(np.asarray(warm[k])) for k in ("path_n", "reg_per_comparison",
                                                        "reg_ratio")
                if warm is not None and k in warm}
        learned = {}
        if len(last) == 3 and n <= REUSE_GROWTH * last["path_n"]:
            model.reg = last["reg_per_comparison"] * n
            learned["tuning"] = {**last, "reg_source": "last path"}
        else:
            chosen = self._path(model, arrays, cfg, sizes, last.get("reg_ratio"))
            warm = chosen.warm_state()   # the final fit continues from the chosen point
            model.reg = chosen.reg
            learned["path"] = [{k: (round(v, 5) if isinstance(v, float) else v)
                                for k, v in point.items()} for point in chosen.path_]
            learned["tuning"] = {"path_n": n, "reg_per_comparison": model.reg / n,
                                 "reg_ratio": model.reg / chosen.reg_max_,
                                 "reg_source": "path", "reg_max": chosen.reg_max_}
        self._on_cluster(model).fit(comparisons, warm_start=warm, **sizes)
        return learned

    def _on_cluster(self, model):
        """``model``, fitted on the run's Ray cluster (:attr:`Trainer.ray_address`), if any."""
        model.ray_address = self.ray_address
        return model

    def refit(self, fitted: Fitted, arrays: dict, cfg) -> dict:
        """With tuned settings and implicit comparisons: those settings refitted on the
        comparisons of every met row (the holdout too), warm-started from the evaluated fit (a
        few iterations), λ as :func:`~.altsvm_tuning.refit` keeps it."""
        tuning, model = fitted.learned.get("tuning") or {}, fitted.model
        self.tuned = dict(tuning.get("choice") or {})   # what the fold-in spec says it used
        if "choice" not in tuning or \
                self.family.dataset_param(cfg.params, "comparisons") != "implicit":
            return {}
        started = time.perf_counter()
        everything = altsvm_tuning.comparisons(
            arrays, self.family, {**cfg.params, **tuning["choice"]},
            (TRAIN, VALIDATION, TEST), int(cfg.evaluation["seed"]))
        arrays.pop(DERIVED[1], None)       # the λ path's and the tuning's are done with
        refitted, fitted.learned["refit_next"] = altsvm_tuning.refit(
            model, everything, tuning, arrays, fitted.learned.get("refit_known", {}))
        fitted.served = refitted.drop_duals()   # only scored and published from here on
        return {"refit_seconds": time.perf_counter() - started,
                "refit_iterations": int(refitted.n_iter_),
                "refit_comparisons": int(len(everything))}

    def _validation_score(self, arrays, cfg):
        def score(fitted) -> float:
            return self.topk_metrics(fitted, arrays, cfg, VALIDATION).get(cfg.metric, 0.0)
        return score

    def _path(self, model, arrays, cfg, sizes, last_ratio):
        """λ by validation: a cold run walks PATH_RATIOS down from reg_max; a warm run tries
        the last ratio and its neighbours. Returns the path's model, fitted at the chosen point
        (its ``reg``, ``reg_max_``, ``path_`` and warm state). The path starts cold either
        way: the last run's fit learned this run's validation rows (the split is stable), and
        a path continuing it scores validation on rows it was fitted to."""
        ratios = PATH_RATIOS if last_ratio is None else \
            np.array([last_ratio * WARM_STEP, last_ratio, last_ratio / WARM_STEP])
        path_model = type(model)(**model.get_params())
        view = tuning_view(arrays)
        score = self._validation_score(view, cfg)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")   # the final fit below warns as a plain fit does
            path_model.fit_path(self.comparisons(view, cfg, (TRAIN,)), score=score,
                                ratios=ratios, patience=2, warm_start=None, **sizes)
        return path_model

    def fit_info(self, model, learned: dict) -> dict:
        info = {"objective": float(model.objective_[-1]), "reg": float(model.reg_),
                "collapsed": model.collapsed_, "engine": model.engine_,
                **({"ray_retried": model.ray_retried_}
                   if getattr(model, "ray_retried_", None) else {})}
        tuning = learned.get("tuning")
        if tuning is not None and "choice" in tuning:
            t = tuning
            return {**info, "tuning": {
                "source": t["source"], "choice": t["choice"],
                "reg_ratio": round(float(t["reg_ratio"]), 5),
                "validation": t.get("validation"), "seconds": round(t.get("seconds", 0.0), 3),
                **{k: t[k] for k in ("users", "confirmed") if k in t}, "tried": t["tried"]},
                "rank": int(model.rank), "loss": model.loss,
                "comparisons": int(len(model._comparisons[0]))}
        if tuning is not None:
            info.update(reg_ratio=tuning["reg_ratio"], reg_source=tuning["reg_source"])
        # reg_max when the run computed it (the path, or a reg_ratio fit, whose reg_max_ is
        # cached); a fit with a given reg does not pay an SVD for the report
        reg_max = (tuning or {}).get("reg_max", model.reg_max_ if model.reg is None else None)
        if reg_max is not None:
            info["reg_max"] = float(reg_max)
        if learned.get("path"):
            info["path"] = learned["path"]
        return info

    # ------------------------------------------------------------------ evaluation

    @staticmethod
    def _relevant(arrays, cfg) -> np.ndarray:
        r = arrays["met_rating"]   # an interaction (NaN rating) is a positive
        return np.isnan(r) | (r >= relevance_of(arrays, cfg))

    def topk_metrics(self, scorer, arrays, cfg, part) -> dict:
        """``topk_*`` metrics of ``scorer``'s lists against the positives of ``part``, over
        the items each user did not meet outside ``part``: every other met item is known to
        the product and never recommended, whether the fit saw it or not (scoring the
        validation part, the test part's items are excluded too). ``scorer`` is a fitted
        AltSVM, factors ``(U, V, b or None)`` (scores ``U V^T + b``) or one score per item
        for everyone. The lists come from the same top-K as the published ones."""
        lists = self.topk_lists(scorer, arrays, cfg, part)
        return {} if lists is None else self.hit_metrics(*lists)

    @staticmethod
    def hit_metrics(ranked, positives, k: int) -> dict:
        """``topk_precision@k``, ``topk_recall@k`` and ``topk_ndcg@k`` of ``ranked`` lists (a
        row per user of :meth:`split_rows`) against their ``positives`` (CSR rows)."""
        from solvers.metrics import topk_hit_metrics

        hits = topk_hit_metrics(ranked, positives.indptr, positives.indices, k=k)
        return {f"topk_{name}@{k}": hits[name] for name in ("precision", "recall", "ndcg")}

    def split_rows(self, arrays, cfg, part):
        """``(users, items to exclude, positives, k)`` of the users with a relevant row in
        ``part`` (see :meth:`topk_metrics`; both as CSR rows, one per user), or None when
        there is none."""
        from scipy.sparse import csr_matrix

        k = int(cfg.evaluation["k"])
        u, i, p = arrays["met_user"], arrays["met_item"], arrays["met_part"]
        shape = (len(arrays["user_ids"]), len(arrays["item_ids"]))
        held = (p == part) & self._relevant(arrays, cfg)
        users = np.unique(u[held])
        if users.size == 0:
            return None
        seen = p != part
        exclude = csr_matrix((np.ones(seen.sum()), (u[seen], i[seen])), shape=shape)[users]
        positives = csr_matrix((np.ones(held.sum()), (u[held], i[held])), shape=shape)[users]
        return users, exclude, positives, k

    def topk_lists(self, scorer, arrays, cfg, part):
        """``(ranked top-k item indices, positives as CSR rows, k)`` of the users with a
        relevant row in ``part`` (see :meth:`topk_metrics`), or None when there is none.

        A run asks for each candidate's holdout lists three times (its metrics, the gate's
        standard error of the blend's lead, the report's intervals): those are ranked once
        and kept for the run, keyed by the factors' contents (a refit in place is a new key),
        the last ``HOLDOUT_LISTS_KEPT`` of them. On Last.fm (15k items) the repeats cost
        2.5 s of a 13 s warm retrain."""
        from solvers.topk import global_topk, user_topk

        U, V, b = factors_of(scorer)
        key = None
        if part == TEST:
            key = (id(arrays), id(cfg), *(content_key(a) for a in (U, V, b)))
            if key in self._holdout_lists:
                return self._holdout_lists[key][-1]
        rows = self.split_rows(arrays, cfg, part)
        lists = None
        if rows is not None:
            users, exclude, positives, k = rows
            if U.shape[0] > 1:
                ranked, _ = user_topk(U[users], V, k, item_bias=b, seen_indptr=exclude.indptr,
                                      seen_indices=exclude.indices)
            else:   # one list for everyone: sorted once, not scored per user
                scores = (V.astype(np.float32) @ U[0].astype(np.float32)
                          + (0 if b is None else b)).astype(np.float32)
                ranked, _ = global_topk(scores, k, seen_indptr=exclude.indptr,
                                        seen_indices=exclude.indices)
            lists = ranked, positives, k
        if key is not None:
            # arrays and cfg stay referenced with their lists: their ids in the key stay theirs
            self._holdout_lists[key] = (arrays, cfg, lists)
            while len(self._holdout_lists) > HOLDOUT_LISTS_KEPT:
                self._holdout_lists.pop(next(iter(self._holdout_lists)))
        return lists

    def holdout_unit(self, arrays: dict, cfg) -> str | None:
        from pipeline.training.per_user_metrics import topk_kind

        known = topk_kind(cfg.metric, cfg.evaluation.get("k")) and "met_part" in arrays
        return "users" if known else None

    def per_unit_holdout(self, candidate, arrays: dict, cfg) -> np.ndarray:
        """Each held-out user's value of the ``topk_*`` gate metric (see
        :func:`~pipeline.training.per_user_metrics.per_user_holdout`)."""
        from pipeline.training.per_user_metrics import per_user_holdout, topk_kind

        kind = topk_kind(cfg.metric, cfg.evaluation.get("k"))
        return per_user_holdout(self, candidate, arrays, cfg, kind)

    def evaluate(self, model, arrays: dict, cfg) -> dict:
        """On TEST, with everything the user met in training excluded: the ``topk_*`` metrics
        of the published lists; the paper's NDCG@k and precision@k over the rated held-out
        items; the pairwise accuracy of their pairs."""
        out = self.topk_metrics(model, arrays, cfg, TEST)
        U, V, b = factors_of(model)
        return {**out, **rated_metrics(
            lambda users, items: pair_scores(U, V, b, users, items), arrays, cfg)}

    def baselines(self, arrays: dict, cfg) -> dict:
        """The trivial models, scored like the model: ``popularity`` (how many users met the
        item positively in training) and ``global`` (wins − losses in the training
        comparisons, the tuned fit's where it had its own: one ranking for everyone).
        Returns {name: (metrics, item scores)}."""
        n_items = len(arrays["item_ids"])
        train = arrays["met_part"] != TEST
        liked = train & self._relevant(arrays, cfg)
        net_wins = arrays.get(DERIVED[2])
        if net_wins is None:
            c = self.comparisons(arrays, cfg)
            net_wins = (np.bincount(c[:, 1], minlength=n_items)
                        - np.bincount(c[:, 2], minlength=n_items))
        found = {"popularity": np.bincount(arrays["met_item"][liked], minlength=n_items),
                 "global": net_wins[:n_items]}
        out = {}
        for name, scores in found.items():
            scores = scores.astype(np.float32)
            metrics = {**self.topk_metrics(scores, arrays, cfg, TEST),
                       **rated_metrics(lambda _, items, s=scores: s[items], arrays, cfg)}
            out[name] = (metrics, scores)
        return out

    # ------------------------------------------------------------------ publishing

    def artifact(self, model, arrays: dict, cfg, **describe):
        """Factors, and for a fitted model how the lookup client folds in a new user: the
        same pairwise problem with V fixed, on implicit comparisons made as training's are."""
        return self.factor_artifact(model, arrays, algorithm=self.family.name,
                                    fold_in=self.fold_in_spec(model, arrays, cfg), **describe)

    def fold_in_spec(self, model, arrays: dict, cfg) -> dict:
        """:func:`~.altsvm_comparisons.fold_in_spec` of ``model`` with this run's tuned
        settings."""
        return fold_in_spec(model, arrays, cfg, self.family, getattr(self, "tuned", {}))

    def factor_artifact(self, model, arrays: dict, **describe):
        """A ``user_item`` artifact of a fitted AltSVM or of factors ``(U, V, b)``; every
        item a user met is left out of their list."""
        from pipeline.serving.artifact import ModelArtifact

        U, V, b = factors_of(model)
        indptr, indices = csr_rows(arrays["met_user"], arrays["met_item"], len(arrays["user_ids"]))
        return ModelArtifact.user_item(
            user_ids=arrays["user_ids"], item_ids=arrays["item_ids"], user_factors=U,
            item_factors=V, item_bias=b, seen=(indptr, indices),
            loser_counts=arrays.get("loser_counts"), **describe)

    def challenger(self, fitted: Fitted, arrays: dict, cfg, warm: dict | None):
        """implicit's ALS, tuned with the same caps, and its blend with the model
        (:mod:`.als`)."""
        from pipeline.training.trainers import als

        self.tuned = dict((fitted.learned.get("tuning") or {}).get("choice") or {})
        return als.challenger(self, fitted.learned.get("validated"), factors_of(fitted.model),
                              factors_of(fitted.served), arrays, cfg, warm,
                              fold_in=self.fold_in_spec(fitted.served, arrays, cfg))

    def checkpoint(self, fitted: Fitted, arrays: dict) -> dict:
        """The warm state, and how the settings or λ were chosen (for the next run's reuse)."""
        out = super().checkpoint(fitted, arrays)
        tuning = fitted.learned.get("tuning")
        if tuning is not None and "choice" in tuning:
            tuned = altsvm_tuning.checkpoint_arrays(tuning, fitted.learned.get("refit_next", {}))
            return {**out, **{WARM_PREFIX + k: v for k, v in tuned.items()}}
        for k, v in (tuning or {}).items():
            if k != "reg_source":
                out[WARM_PREFIX + k] = np.array(v)
        return out
