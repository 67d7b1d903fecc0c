#!/usr/bin/env bash
# Stop the 6 nodes of the Redis Cluster started by cluster-start.sh for this base port, each by
# the pid in its pid file, and only if that pid is a redis-server on that node's port
# (infra/stop_pid.sh). Idempotent.
set -euo pipefail
. "$(dirname "$0")/../state.sh"
base=${RANKSTREAM_REDIS_CLUSTER_PORT:-7000}
dir=${RANKSTREAM_REDIS_CLUSTER_DIR:-$(rs_state_dir "redis-cluster-$base")}
stop_pid=$(cd "$(dirname "$0")/.." && pwd)/stop_pid.sh
status=0
for port in $(seq "$base" $((base + 5))); do
  "$stop_pid" "redis cluster node $port" "$dir/$port/redis.pid" 10 \
    "redis-server .*:$port( |\$)" || status=1
done
exit $status
