#!/usr/bin/env bash
# Stop the broker started by start.sh for this port, by its process id; idempotent.
set -euo pipefail
port=${RANKSTREAM_KAFKA_PORT:-9092}
dir=${RANKSTREAM_KAFKA_DIR:-${TMPDIR:-/tmp}/rankstream-kafka-$port}
here=$(cd "$(dirname "$0")/.." && pwd)
exec "$here/stop_pid.sh" kafka "$dir/kafka.pid" 20
