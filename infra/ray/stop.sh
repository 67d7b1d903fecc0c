#!/usr/bin/env bash
# Stop the Ray nodes infra/ray/start.sh started for this port, by their process ids (each
# `ray start --block` stops its node's processes when it gets SIGTERM); workers first.
set -euo pipefail
. "$(dirname "$0")/../state.sh"
port=${RANKSTREAM_RAY_PORT:-6390}
dir=${RANKSTREAM_RAY_DIR:-$(rs_state_dir "ray-$port")}
stop="$(cd "$(dirname "$0")/.." && pwd)/stop_pid.sh"
for pidfile in "$dir"/worker-*.pid "$dir/head.pid"; do
  [[ -f $pidfile ]] || continue
  "$stop" "ray $(basename "$pidfile" .pid)" "$pidfile" 20 "infra/ray/node.py start"
done
