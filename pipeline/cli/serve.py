"""``rankstream serve``: the HTTP API (:mod:`pipeline.serving.api`) under uvicorn."""

from __future__ import annotations

import os
import sys

from pipeline.cli._redis import add_redis_arguments, fail, settings_of


def add_arguments(parser) -> None:
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to bind (default 127.0.0.1: this machine only)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--token-env", default="RANKSTREAM_API_TOKEN",
                        help="environment variable holding the bearer token every route but "
                        "/healthz then needs (default RANKSTREAM_API_TOKEN; unset: no token)")
    parser.add_argument("--ssl-certfile", help="serve HTTPS with this certificate (PEM)")
    parser.add_argument("--ssl-keyfile", help="... and this key")
    add_redis_arguments(parser)


def run(args) -> int:
    import uvicorn

    from pipeline.serving.api import create_app
    from pipeline.serving.lookup import TopK
    from pipeline.training.config import load_models

    try:
        settings = settings_of(args)
        if not settings.redis_url:
            raise ValueError("no Redis to serve from: pass --redis-url or set "
                             "RANKSTREAM_REDIS_URL")
        models = list(load_models(settings.config)) if settings.config else []
        if bool(args.ssl_certfile) != bool(args.ssl_keyfile):
            raise ValueError("HTTPS needs both --ssl-certfile and --ssl-keyfile")
        topk = TopK.from_settings(settings)
    except (ValueError, OSError) as err:
        return fail("serve", err)
    app = create_app(topk, models=models, token=os.environ.get(args.token_env) or None)
    print(f"rankstream serve: http{'s' if args.ssl_certfile else ''}://{args.host}:{args.port} "
          f"({len(models)} configured models)", file=sys.stderr, flush=True)
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level="warning",
                    ssl_certfile=args.ssl_certfile, ssl_keyfile=args.ssl_keyfile)
    finally:
        topk.close()
    return 0
