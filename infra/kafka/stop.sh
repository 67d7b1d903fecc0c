#!/usr/bin/env bash
# Stop the broker started by start.sh for this port, by its process id; idempotent.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
. "$here/state.sh"
port=${RANKSTREAM_KAFKA_PORT:-9092}
dir=${RANKSTREAM_KAFKA_DIR:-$(rs_state_dir "kafka-$port")}
exec "$here/stop_pid.sh" kafka "$dir/kafka.pid" 20 "java .*kafka\.Kafka $dir/server\.properties"
