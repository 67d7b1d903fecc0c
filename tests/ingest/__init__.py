"""Tests of events, validation, the event store and Kafka/file ingestion (issue 5)."""
