"""``python -m tests.adversarial.faulty_ingest STEP MODE N BOOTSTRAP TOPIC HOME GROUP``: drain a
topic with ``ingest_kafka(until_end=True)`` after arranging that the N-th call of STEP fails
(MODE ``raise``: an exception; ``kill``: the process SIGKILLs itself), or with no fault when
STEP is ``none``. Exit status 0 when the run completed."""

from __future__ import annotations

import os
import signal
import sys

from pipeline.ingest import buffer
from pipeline.ingest.buffer import PartitionBuffer
from pipeline.ingest.dead_letters import DeadLetterPublisher
from pipeline.ingest.kafka import _KafkaRun, ingest_kafka
from pipeline.ingest.store import EventStore
from pipeline.settings import Settings

# step -> (class or module, function, whether the fault comes after the original call)
STEPS = {
    "add": (PartitionBuffer, "add_messages", False),     # a poll batch fails to be added
    "decode": (buffer, "decode", False),                  # decoding fails inside a batch
    "dead_letters": (DeadLetterPublisher, "publish", False),
    "write": (EventStore, "write", False),                # before the segment group is written
    "written": (EventStore, "write", True),               # after it is durable, before commit
    "commit": (_KafkaRun, "_commit", False),
}


class Fault(Exception):
    pass


def arrange(step: str, mode: str, nth: int) -> None:
    cls, name, after = STEPS[step]
    original = getattr(cls, name)
    calls = [0]

    def fail():
        if mode == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        raise Fault(f"injected fault in {step} (call {nth})")

    def faulty(*args, **kwargs):
        calls[0] += 1
        if not after and calls[0] == nth:
            fail()
        result = original(*args, **kwargs)
        if after and calls[0] == nth:
            fail()
        return result

    setattr(cls, name, faulty)


def main(argv):
    step, mode, nth, bootstrap, topic, home, group = argv
    if step != "none":
        arrange(step, mode, int(nth))
    settings = Settings(home=home, kafka_bootstrap=bootstrap, dead_letter_topic=f"dlq-{topic}")
    summary = ingest_kafka([topic], kind="rating", settings=settings, group_id=group,
                           until_end=True, flush_events=200, flush_interval=5.0,
                           max_poll_records=250, progress=False)
    print(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
