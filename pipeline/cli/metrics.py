"""``rankstream metrics``: the pipeline's Prometheus metrics (ingest lag per topic partition,
dead letters by reason, each model's last retrain: :mod:`pipeline.training.pipeline_gauges`),
printed once in the text format, or served at ``http://HOST:PORT/metrics`` with ``--port``
(loopback by default). ``rankstream serve --pipeline-metrics`` adds the same to the API's
``/metrics``."""

from __future__ import annotations

import sys
import time

from pipeline.cli._redis import fail
from pipeline.cli._settings_args import add_settings_arguments, load_settings


def add_arguments(parser) -> None:
    parser.add_argument("--port", type=int, help="serve /metrics on this port (default: print "
                        "once and exit)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to bind with --port (default 127.0.0.1)")
    add_settings_arguments(parser)


def run(args) -> int:
    from prometheus_client import CollectorRegistry, generate_latest, start_http_server

    from pipeline.refresh.gauges import RefreshCollector
    from pipeline.training.config import load_models
    from pipeline.training.pipeline_gauges import PipelineCollector

    try:
        settings = load_settings(args)
        models = list(load_models(settings.config)) if settings.config else []
    except (ValueError, OSError) as err:
        return fail("metrics", err)
    registry = CollectorRegistry()
    registry.register(PipelineCollector(settings, models))
    registry.register(RefreshCollector(settings, models))
    if args.port is None:
        sys.stdout.write(generate_latest(registry).decode())
        return 0
    try:
        server, thread = start_http_server(args.port, addr=args.host, registry=registry)
    except OSError as err:
        return fail("metrics", f"cannot listen on {args.host}:{args.port} ({err.strerror}): "
                    "pick another --port, or stop what uses it")
    print(f"rankstream metrics: http://{args.host}:{args.port}/metrics", file=sys.stderr,
          flush=True)
    try:
        while thread.is_alive():
            time.sleep(1.0)
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()
    return 0
