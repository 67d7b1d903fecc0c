"""Ingestion: events, codecs, validation, file and Kafka sources, the producer, partition
buffers, dead letters and the event store."""
