"""Refresher tests against a real broker and redis-server."""

from pipeline.training.config import parse_model


def models() -> dict:
    """The small AltSVM ``movies`` config both refresh test files train and refresh."""
    spec = {"algorithm": "altsvm", "kinds": ["rating"],
            "params": {"rank": 8, "reg_ratio": 0.3, "item_bias": True, "max_iter": 30,
                       "tol": 1e-4, "random_state": 0, "n_threads": 1,
                       "comparisons": "implicit", "implicit_per_user": 200,
                       "implicit_min_rating": "relevance"},
            "evaluation": {"holdout": 4},
            "gate": {"tolerance": 1.0, "if_trivial": "publish_trivial"}}
    return {"movies": parse_model("movies", spec, "test")}
