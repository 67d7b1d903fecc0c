"""rankstream's pipeline: events, ingestion, event store, datasets, model state, publishing,
lookup and the ``rankstream`` command line. Heavy imports happen inside functions."""
