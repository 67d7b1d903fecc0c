"""``rankstream publish MODEL PATH``: publish a model artifact to Redis as a new version, flip
``current`` to it and prune old versions. PATH is a run directory of the retrain loop
(``HOME/runs/MODEL/RUN``, whose ``artifact/`` is published) or an artifact directory written
by ``ModelArtifact.save``."""

from __future__ import annotations

from pathlib import Path

from pipeline.cli._redis import add_redis_arguments, fail, redis_client


def add_arguments(parser) -> None:
    parser.add_argument("model", help="model name (letters, digits, _ . -)")
    parser.add_argument("path", help="a run directory (HOME/runs/MODEL/RUN) or an artifact "
                        "directory (manifest.json + arrays.npz)")
    parser.add_argument("--top-k", type=int, default=100, help="precomputed list length "
                        "(default 100)")
    parser.add_argument("--keep-versions", type=int, default=3, help="versions kept, the new "
                        "one included (default 3)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--force", action="store_true", help="publish a run the quality gate "
                        "rejected (says what it overrides)")
    add_redis_arguments(parser)


def artifact_dir(path) -> Path:
    """The artifact to publish: ``path`` itself, or what a run directory's quality gate chose
    (``gate.json``'s ``publishes``: the model's ``artifact/``, a challenger's, a blend's or a
    trivial list's directory; once the run has published, the checkpoint that
    ``published.json`` names holds it), else the run's ``artifact/``. A run whose gate chose
    a challenger no longer publishes the model it rejected by default."""
    from pipeline.durable import read_json
    from pipeline.training.run_types import Choice

    path = Path(path)
    checkpoint = (read_json(path / "published.json") or {}).get("checkpoint")
    if checkpoint and (Path(checkpoint) / "artifact").is_dir():
        return Path(checkpoint) / "artifact"
    chosen = (read_json(path / "gate.json") or {}).get("publishes")
    if chosen and (path / Choice.parse(chosen).dir_name).is_dir():
        return path / Choice.parse(chosen).dir_name
    if (path / "artifact").is_dir():
        return path / "artifact"
    return path


def check_publishable(model: str, path, artifact, served: list, force: bool) -> str | None:
    """Refuse what would serve the wrong thing under ``model``: a run directory of another
    model, an artifact of another algorithm or kind than the version ``model`` serves, or a
    run the gate rejected (unless ``force``: then the returned line says what it overrides).

    >>> check_publishable("m", "/nonexistent", None, [], False) is None
    True
    """
    from pipeline.durable import read_json

    path = Path(path)
    trained = read_json(path / "train.json") or {}
    if trained.get("model") not in (None, model):
        raise ValueError(f"{path} is a run of model {trained['model']!r}, not {model!r}: "
                         f"publish it as {trained['model']!r}, or give a run of {model!r}")
    current = [v for v in served if v.current]
    if artifact is not None and current:
        family = (current[0].algorithm or "").split(":")[0]
        if current[0].kind != artifact.kind or (
                family and artifact.algorithm and artifact.algorithm.split(":")[0] != family):
            raise ValueError(f"{model!r} serves a {current[0].kind} model of {family!r}; this "
                             f"artifact is a {artifact.kind} model of "
                             f"{artifact.algorithm or 'unknown algorithm'!r}: give an artifact "
                             "of the same model")
    gate = read_json(path / "gate.json") or {}
    if gate and not gate.get("publish"):
        if not force:
            raise ValueError(f"the quality gate rejected this run ({gate.get('reason')}); "
                             "--force publishes it anyway")
        return f"overriding the quality gate's rejection: {gate.get('reason')}"
    return None


def run(args) -> int:
    import redis

    from pipeline.serving.artifact import ModelArtifact
    from pipeline.serving.publish import publish
    from pipeline.serving.versions import served_versions

    try:
        where = artifact_dir(args.path)
        artifact = ModelArtifact.load(where)
        if artifact.served_as != "model":
            print(f"rankstream publish: {args.path} serves {artifact.served_as}, what its quality "
                  f"gate chose (from {where}); give {Path(args.path) / 'artifact'} for the "
                  "model itself")
        with redis_client(args) as (settings, client):
            served = served_versions(args.model, client, namespace=settings.namespace)
            said = check_publishable(args.model, args.path, artifact, served, args.force)
            if said:
                print(f"rankstream publish: {said}")
            res = publish(args.model, artifact, client, top_k=args.top_k,
                          keep_versions=args.keep_versions, namespace=settings.namespace,
                          progress=not args.no_progress)
    except (OSError, ValueError, RuntimeError, redis.RedisError) as err:
        return fail("publish", err)
    what = (f"{res.n_lists} precomputed lists" if res.n_lists else "a global list")
    pruned = f"; pruned versions {res.pruned}" if res.pruned else ""
    print(f"published {res.namespace}/{res.model} version {res.version} ({res.kind}, "
          f"{res.n_items} items, {what}) in {res.seconds:.2f} s{pruned}")
    return 0
