#!/usr/bin/env bash
# Stop the redis-server started by start.sh for this port, by its process id; idempotent.
set -euo pipefail
. "$(dirname "$0")/../state.sh"
port=${RANKSTREAM_REDIS_PORT:-6379}
dir=${RANKSTREAM_REDIS_DIR:-$(rs_state_dir "redis-$port")}
exec "$(cd "$(dirname "$0")/.." && pwd)/stop_pid.sh" redis "$dir/redis.pid" 10 \
  "redis-server .*:$port( |\$)"
