"""Serving: the Redis layout (REDIS_LAYOUT.md), model artifacts, publishing, versions, the
lookup client and Redis connections."""
