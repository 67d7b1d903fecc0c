"""``rankstream publish MODEL ARTIFACT``: publish a saved model artifact to Redis as a new
version, flip ``current`` to it and prune old versions."""

from __future__ import annotations

from pipeline.commands._redis import add_redis_arguments, fail, redis_session


def add_arguments(parser) -> None:
    parser.add_argument("model", help="model name (letters, digits, _ . -)")
    parser.add_argument("artifact", help="directory written by ModelArtifact.save "
                        "(manifest.json + arrays.npz)")
    parser.add_argument("--top-k", type=int, default=100, help="precomputed list length "
                        "(default 100)")
    parser.add_argument("--keep-versions", type=int, default=3, help="versions kept, the new "
                        "one included (default 3)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_redis_arguments(parser)


def run(args) -> int:
    from pipeline.artifact import ModelArtifact
    from pipeline.publish import publish
    from pipeline.redis_client import client_from_url

    try:
        artifact = ModelArtifact.load(args.artifact)
        with redis_session(args) as (settings, url):
            client = client_from_url(url, retries=3)
            res = publish(args.model, artifact, client, top_k=args.top_k,
                          keep_versions=args.keep_versions, namespace=settings.namespace,
                          progress=not args.no_progress)
            client.close()
    except (OSError, ValueError, RuntimeError) as err:
        return fail("publish", err)
    what = (f"{res.n_lists} precomputed lists" if res.n_lists else "a global list")
    pruned = f"; pruned versions {res.pruned}" if res.pruned else ""
    print(f"published {res.namespace}/{res.model} version {res.version} ({res.kind}, "
          f"{res.n_items} items, {what}) in {res.seconds:.2f} s{pruned}")
    return 0
