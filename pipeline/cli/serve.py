"""``rankstream serve``: the HTTP API (:mod:`pipeline.serving.api`), one process per core.

The server is granian or uvicorn (``--server``; ``bench/serve_load.py`` measures both). Each
worker process builds its application with :func:`app_from_environment` from the options this
command puts in its environment (``RANKSTREAM_SERVE``, JSON; the token stays in the variable
the user named). The metrics of all workers meet in a directory of this server's own under
``~/.local/state/rankstream/serve``, removed when it stops.
"""

from __future__ import annotations

import json
import os
import shutil
import sys

from pipeline.cli._redis import add_redis_arguments, fail, settings_of

SERVERS = ("granian", "uvicorn")
OPTIONS = "RANKSTREAM_SERVE"


def add_arguments(parser) -> None:
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to bind (default 127.0.0.1: this machine only)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                        help="server processes (default: one per core)")
    parser.add_argument("--server", choices=SERVERS, default=SERVERS[0],
                        help="the ASGI server (default granian: see bench/serve_load.py)")
    parser.add_argument("--token-env", default="RANKSTREAM_API_TOKEN",
                        help="environment variable holding the bearer token every route but "
                        "/healthz then needs (default RANKSTREAM_API_TOKEN; unset: no token)")
    parser.add_argument("--pipeline-metrics", action="store_true",
                        help="add the pipeline's metrics (ingest lag, dead letters, last "
                        "retrains: see `rankstream metrics`) to /metrics")
    parser.add_argument("--require", nargs="+", metavar="MODEL", default=None,
                        help="models /readyz needs served to answer 200 (default: every "
                        "configured model that has a served version; a model never trained "
                        "does not take the server out of rotation)")
    parser.add_argument("--ssl-certfile", help="serve HTTPS with this certificate (PEM)")
    parser.add_argument("--ssl-keyfile", help="... and this key")
    add_redis_arguments(parser)


def app_from_environment():
    """The application of one worker, from the options ``rankstream serve`` left in the
    environment."""
    from argparse import Namespace

    from threadpoolctl import threadpool_limits

    from pipeline.serving.api import create_app
    from pipeline.serving.http_metrics import ServeMetrics
    from pipeline.serving.lookup import TopK
    from pipeline.serving.ui import UiSources
    from pipeline.training.config import item_titles, load_models
    from solvers.fold_in import warm_up as load_fold_in

    # one server process per core: a BLAS thread pool in each would fight the others for the
    # cores (fold-in's solve and the similar-items product are BLAS calls)
    threadpool_limits(1)
    load_fold_in()          # before the first request, not during it
    options = json.loads(os.environ[OPTIONS])
    settings = settings_of(Namespace(**options["redis"]))
    models = list(load_models(settings.config)) if settings.config else []
    topk = TopK.from_settings(settings)
    extra = []
    if options["pipeline_metrics"]:
        from pipeline.refresh.gauges import RefreshCollector
        from pipeline.training.pipeline_gauges import PipelineCollector

        extra.append(PipelineCollector(settings, models))
        extra.append(RefreshCollector(settings, models))
    pages = UiSources(titles=item_titles(settings.config) if settings.config else {},
                      runs_dir=settings.runs_dir)
    return create_app(topk, models=models, token=os.environ.get(options["token_env"]) or None,
                      metrics=ServeMetrics(topk, models, extra),
                      require=options.get("require") or None, ui_sources=pages)


def run(args) -> int:
    from pipeline.settings import state_dir

    try:
        settings = settings_of(args)
        if not settings.redis_url:
            raise ValueError("no Redis to serve from: pass --redis-url or set "
                             "RANKSTREAM_REDIS_URL")
        if bool(args.ssl_certfile) != bool(args.ssl_keyfile):
            raise ValueError("HTTPS needs both --ssl-certfile and --ssl-keyfile")
        if args.workers < 1:
            raise ValueError(f"--workers is {args.workers}, expected 1 or more")
        _check_address(args.host, args.port)
        if settings.config:
            from pipeline.training.config import load_models

            load_models(settings.config)      # a config mistake: one line, before the server
    except (ValueError, OSError) as err:
        return fail("serve", err)
    metrics_dir = state_dir("serve") / str(os.getpid())
    shutil.rmtree(metrics_dir, ignore_errors=True)   # a dead server's of this pid: ours
    metrics_dir.mkdir(mode=0o700)
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(metrics_dir)
    for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(name, "1")      # see app_from_environment
    os.environ[OPTIONS] = json.dumps({
        "redis": {"redis_url": args.redis_url, "namespace": args.namespace,
                  "home": args.home, "config": args.config},
        "token_env": args.token_env, "pipeline_metrics": args.pipeline_metrics,
        "require": args.require})
    scheme = "https" if args.ssl_certfile else "http"
    print(f"rankstream serve: {scheme}://{args.host}:{args.port} ({args.server}, "
          f"{args.workers} workers)", file=sys.stderr, flush=True)
    try:
        _SERVE[args.server](args)
    except KeyboardInterrupt:
        pass
    finally:
        shutil.rmtree(metrics_dir, ignore_errors=True)
    return 0


def _check_address(host: str, port: int) -> None:
    """A ValueError saying so when ``host:port`` cannot be bound (taken, or not this
    machine's): the servers would answer that with a backtrace."""
    import socket

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        with socket.socket(infos[0][0], socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(infos[0][4])
    except (OSError, IndexError) as err:
        raise ValueError(f"cannot listen on {host}:{port} ({getattr(err, 'strerror', err)}): "
                         "pick another --port, or stop what uses it") from None


def _uvicorn(args) -> None:
    import uvicorn

    uvicorn.run("pipeline.cli.serve:app_from_environment", factory=True, host=args.host,
                port=args.port, workers=args.workers, log_level="warning", access_log=False,
                ssl_certfile=args.ssl_certfile, ssl_keyfile=args.ssl_keyfile)


def _granian(args) -> None:
    from granian import Granian
    from granian.constants import Interfaces

    Granian("pipeline.cli.serve:app_from_environment", factory=True, address=args.host,
            port=args.port, interface=Interfaces.ASGI, workers=args.workers,
            log_access=False, log_level="warning", workers_kill_timeout=5,
            ssl_cert=args.ssl_certfile, ssl_key=args.ssl_keyfile).serve()


_SERVE = {"granian": _granian, "uvicorn": _uvicorn}
