"""Command-line flags shared by ``produce``, ``ingest``, ``rekey`` and ``store``: they override
the environment and the TOML file (see :mod:`pipeline.settings`)."""

from __future__ import annotations

import argparse
import logging


def add_settings_arguments(parser: argparse.ArgumentParser, kafka: bool = True) -> None:
    group = parser.add_argument_group("settings (flags > RANKSTREAM_* environment > TOML file)")
    group.add_argument("--config", help="TOML file with a [rankstream] table")
    group.add_argument("--home", help="working directory holding store/ and dead-letter/")
    group.add_argument("--store", help="where the store, runs and checkpoints live, if not in "
                                       "HOME: a directory or s3://bucket/prefix")
    if kafka:
        group.add_argument("--bootstrap", dest="kafka_bootstrap",
                           help="Kafka bootstrap servers, host:port[,host:port]")
        group.add_argument("--dead-letter-topic", help="topic for events that fail validation")
    parser.add_argument("--no-progress", dest="progress", action="store_false",
                        help="no progress bar")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")


def load_settings(args: argparse.Namespace):
    from pipeline.settings import Settings

    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    names = ("config", "home", "store", "kafka_bootstrap", "dead_letter_topic")
    return Settings.load({name: getattr(args, name, None) for name in names})


def no_kafka(settings, command: str, hint: str = "") -> bool:
    """Whether ``settings`` names no Kafka bootstrap servers; if so, says so in one line on
    stderr for ``rankstream COMMAND`` (``hint``: what to do instead)."""
    if settings.kafka_bootstrap:
        return False
    import sys

    print(f"rankstream {command}: no Kafka bootstrap servers (--bootstrap or "
          f"RANKSTREAM_KAFKA_BOOTSTRAP){hint}", file=sys.stderr)
    return True
