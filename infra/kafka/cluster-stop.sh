#!/usr/bin/env bash
# Stop the brokers started by cluster-start.sh, each by its process id; idempotent.
#   cluster-stop.sh --node N   stop node N alone
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
. "$here/state.sh"
base=${RANKSTREAM_KAFKA_CLUSTER_PORT:-19092}
dir=${RANKSTREAM_KAFKA_CLUSTER_DIR:-$(rs_state_dir "kafka-cluster-$base")}
nodes=(1 2 3) grace=20
if [[ ${1:-} == --node ]]; then nodes=("${2:?--node needs 1, 2 or 3}"); fi
for n in "${nodes[@]}"; do
  "$here/stop_pid.sh" "kafka node $n" "$dir/node-$n/kafka.pid" "$grace" \
    "java .*kafka\.Kafka $dir/node-$n/server\.properties"
done
