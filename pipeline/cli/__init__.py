"""The ``rankstream`` command line.

Each subcommand lives in ``pipeline/cli/<name>.py`` with ``add_arguments(parser)`` and
``run(args) -> int``; it is imported only when called, so ``rankstream --help`` stays fast.

Exit status: 0 done (``train``: published, unchanged, republished or trained without
publishing); 1 an error, said in one line on stderr; 2 a usage mistake or a refused input
(one line: what to do); 3 ``train`` only: the quality gate rejected the model (the served
version stays); 4 ``train`` only: the run lost the model's lease (it expired or was revoked)
before its flip, so it did not publish over the run that holds it now.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# name -> (module under pipeline.cli, one-line help)
COMMANDS = {
    "demo": ("demo", "run the whole pipeline on embedded defaults and print a report"),
    "produce": ("produce", "send events from a file (JSON lines, CSV, Parquet) to Kafka"),
    "rekey": ("rekey", "copy a topic's events to a topic keyed by user (for refreshers)"),
    "ingest": ("ingest", "Kafka (or files) -> validated event store; bad events -> dead letter"),
    "store": ("store", "inspect the event store (stats)"),
    "train": ("train", "retrain a configured model with warm start, evaluate, gate, publish"),
    "models": ("models", "list configured models with their current version and metric"),
    "publish": ("publish", "publish a trained checkpoint to Redis"),
    "recommend": ("recommend", "top-K lookup from Redis for a user or query"),
    "versions": ("versions", "list the published versions of a model"),
    "rollback": ("rollback", "flip a model's current version back"),
    "lease": ("lease", "who holds a model's retrain lease; --revoke takes it away"),
    "refresh": ("refresh", "keep users' answers fresh between retrains (Kafka -> fold-in "
                "-> Redis)"),
    "serve": ("serve", "the HTTP API over the served models (loopback by default)"),
    "report": ("report", "open a model's latest run report (HTML with figures)"),
    "metrics": ("metrics", "the pipeline's Prometheus metrics: ingest lag, dead letters, "
                "retrains"),
}


def _parser() -> argparse.ArgumentParser:
    width = max(map(len, COMMANDS))
    listing = "\n".join(f"  {n:<{width}}  {h}" for n, (_, h) in COMMANDS.items())
    parser = argparse.ArgumentParser(
        prog="rankstream",
        usage="rankstream [-h] SUBCOMMAND [options]",
        description="Streaming large-margin rankers: Kafka events -> warm-started solvers -> "
                    "Redis top-K.",
        epilog=f"subcommands:\n{listing}\n\n'rankstream SUBCOMMAND --help' shows its options.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("command", metavar="SUBCOMMAND", choices=list(COMMANDS),
                        help=argparse.SUPPRESS)
    parser.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = _parser()
    if not argv:
        parser.print_help()
        return 2
    top = parser.parse_args(argv[:1])
    module_name, help_text = COMMANDS[top.command]
    module = importlib.import_module(f"pipeline.cli.{module_name}")
    sub = argparse.ArgumentParser(prog=f"rankstream {top.command}", description=help_text)
    module.add_arguments(sub)
    from pipeline.storage import StorageError

    try:
        return int(module.run(sub.parse_args(argv[1:])) or 0)
    except StorageError as err:      # the object store is down or refused: one line, any command
        print(f"rankstream {top.command}: {err}", file=sys.stderr)
        return 1
    except BrokenPipeError:   # `rankstream store stats | head` closed the pipe: not an error
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0

