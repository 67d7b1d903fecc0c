"""``python -m tests.ingest.slow_ingest DELAY BOOTSTRAP TOPIC HOME GROUP``: drain a topic with
``ingest_kafka(until_end=True)`` into the store under HOME, taking DELAY seconds more over each
poll batch (of at most 100 messages), as on a slow machine, so that a test can have another
consumer join while this one is mid-stream however fast the machine is. Prints the summary as
JSON."""

from __future__ import annotations

import json
import sys
import time

from pipeline.ingest.buffer import PartitionBuffer
from pipeline.ingest.kafka import ingest_kafka
from pipeline.settings import Settings


def main(argv) -> int:
    delay, bootstrap, topic, home, group = argv
    add_messages = PartitionBuffer.add_messages

    def slow_add_messages(self, *args, **kwargs):
        time.sleep(float(delay))
        return add_messages(self, *args, **kwargs)

    PartitionBuffer.add_messages = slow_add_messages
    settings = Settings(home=home, kafka_bootstrap=bootstrap, dead_letter_topic=f"dlq-{topic}")
    summary = ingest_kafka([topic], kind="rating", settings=settings, group_id=group,
                           until_end=True, flush_events=300, max_poll_records=100,
                           progress=False)
    print(json.dumps({"events": sum(summary.events.values()), "stopped": summary.stopped,
                      "dead_letters": sum(summary.dead_letters.values())}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
