"""A retriable Kafka client error from ``poll`` (a broker killed mid-run: kafka-python raises
its metadata refresh's ``KafkaConnectionError`` there while a new leader is elected) does not
end an ingest run: the loop pauses and polls again; any other error still ends it. Pure loop
logic, with a stub consumer (the broker-kill test in tests/multihost shows it end to end)."""

from __future__ import annotations

import threading

import pytest
from kafka.errors import KafkaConnectionError, UnsupportedVersionError

from pipeline.ingest import kafka_run
from pipeline.ingest.kafka_run import KafkaRun
from pipeline.settings import Settings


class _Consumer:
    def __init__(self, errors, stop):
        self.errors, self.stop, self.polls = list(errors), stop, 0

    def poll(self, timeout_ms, max_records):
        self.polls += 1
        if self.errors:
            raise self.errors.pop(0)
        self.stop.set()           # the loop's next turn ends the run
        return {}


def _run(tmp_path, errors, monkeypatch):
    monkeypatch.setattr(kafka_run, "POLL_RETRY_SECONDS", 0.01)
    stop = threading.Event()
    run = KafkaRun(Settings(home=tmp_path), store=None, default_kinds={}, group_id="g",
                   flush_events=10, flush_interval=1.0, max_poll_records=10,
                   max_message_bytes=1 << 20, progress=False, stop_event=stop)
    run.consumer = _Consumer(errors, stop)
    run.bar = kafka_run.progress_bar(False, total=None)
    return run, run._loop({}, until_end=False, started=0.0, timeout=None)


def test_a_retriable_poll_error_is_retried_not_fatal(tmp_path, monkeypatch, caplog):
    run, stopped = _run(tmp_path, [KafkaConnectionError("111 ECONNREFUSED")] * 2, monkeypatch)
    assert stopped == "stop requested" and run.consumer.polls == 3
    assert "poll failed (KafkaConnectionError: 111 ECONNREFUSED): polling again" in caplog.text


def test_any_other_client_error_still_ends_the_run(tmp_path, monkeypatch):
    with pytest.raises(UnsupportedVersionError):
        _run(tmp_path, [UnsupportedVersionError("no")], monkeypatch)
