#!/usr/bin/env bash
# Start a local Ray cluster bound to 127.0.0.1: a head node with no CPUs of its own (the
# driver, `rankstream train`, runs beside it) and RANKSTREAM_RAY_WORKERS worker nodes, each a
# separate `ray start` process with its own CPUs. Idempotent; waits until every worker joined.
#
#   RANKSTREAM_RAY_PORT            the head's GCS port (default 6390; 6379 is Redis's)
#   RANKSTREAM_RAY_WORKERS         worker nodes (default 2)
#   RANKSTREAM_RAY_WORKER_CPUS     CPUs per worker node (default 1: one AltSVM worker each)
#   RANKSTREAM_RAY_WORKER_MEMORY   bytes per worker node, a scheduling cap (default 3000000000)
#   RANKSTREAM_RAY_DIR             state dir (default ~/.local/state/rankstream/ray-$PORT):
#                                  pid files, logs
#   RANKSTREAM_RAY_SESSION_DIR     Ray's session files (default ~/.cache/rankstream-ray-$PORT:
#                                  Ray refuses a socket path over 107 bytes, and its session
#                                  names are long); the head's there, each worker node's in
#                                  its own w<N> below it, as separate hosts would have them
# Prints "ray started: ... address 127.0.0.1:PORT"; infra/ray/stop.sh stops what it started.
set -euo pipefail
. "$(dirname "$0")/../state.sh"
repo=$(cd "$(dirname "$0")/../.." && pwd)
python=${RANKSTREAM_PYTHON:-$repo/.venv/bin/python}
port=${RANKSTREAM_RAY_PORT:-6390}
workers=${RANKSTREAM_RAY_WORKERS:-2}
cpus=${RANKSTREAM_RAY_WORKER_CPUS:-1}
memory=${RANKSTREAM_RAY_WORKER_MEMORY:-3000000000}
dir=${RANKSTREAM_RAY_DIR:-$(rs_state_dir "ray-$port")}
session=${RANKSTREAM_RAY_SESSION_DIR:-$HOME/.cache/rankstream-ray-$port}
(umask 077 && mkdir -p "$dir" "$session")
address=127.0.0.1:$port
# values up to 8 MiB go inline, not through the object store: a V-step round's blocks take
# 1.4 ms a hop instead of 5.6 (solvers/altsvm_ray.py sets the same in the driver)
export RAY_max_direct_call_object_size=${RAY_max_direct_call_object_size:-8388608}

alive() { [[ -f $1 ]] && kill -0 "$(cut -d' ' -f1 "$1")" 2>/dev/null; }
nodes() {   # worker nodes alive in the cluster, as the GCS says (head excluded)
  "$python" - "$address" <<'PY' 2>/dev/null || echo 0
import sys
from solvers.ray_loopback import keep_loopback
keep_loopback()
import ray
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
print(sum(1 for n in ray.nodes() if n["Alive"] and n["Resources"].get("CPU", 0) > 0))
PY
}
launch() {  # NAME ARGS...: a `ray start --block` in its own session, its pid and start time
  local name=$1; shift
  setsid nohup "$python" "$repo/infra/ray/node.py" start --block --node-ip-address=127.0.0.1 \
    --disable-usage-stats "$@" > "$dir/$name.log" 2>&1 < /dev/null &
  local pid=$!
  echo "$pid $(sed 's/.*) //' "/proc/$pid/stat" | cut -d' ' -f20)" > "$dir/$name.pid"
}

if ! alive "$dir/head.pid"; then
  launch head --head --port="$port" --num-cpus=0 --temp-dir="$session" \
    --include-dashboard=false --ray-client-server-port=$((port + 1)) \
    --dashboard-agent-listen-port=$((port + 2))
  for _ in $(seq 1 120); do
    grep -q "Ray runtime started" "$dir/head.log" 2>/dev/null && break
    alive "$dir/head.pid" || { echo "ray head failed; see $dir/head.log" >&2; exit 1; }
    sleep 0.5
  done
fi
worker() {  # W: start worker node W, its session files in a temp dir of its own
  (umask 077 && mkdir -p "$session/w$1")
  launch "worker-$1" --address="$address" --num-cpus="$cpus" --memory="$memory" \
    --object-store-memory=$((memory / 4)) --dashboard-agent-listen-port=$((port + 2 + $1)) \
    --temp-dir="$session/w$1"
}
for w in $(seq 1 "$workers"); do
  if ! alive "$dir/worker-$w.pid"; then
    worker "$w"
    sleep 1    # one node at a time: two joining at once on 2 cores timed out once
  fi
done
declare -A tries
for _ in $(seq 1 90); do
  for w in $(seq 1 "$workers"); do
    # Ray gives a starting node 30 s (fixed); on a busy machine one ran out: start it again
    if ! alive "$dir/worker-$w.pid"; then
      tries[$w]=$(( ${tries[$w]:-0} + 1 ))
      if (( tries[$w] > 2 )); then
        echo "ray worker $w failed 3 times; see $dir/worker-$w.log" >&2
        exit 1
      fi
      worker "$w"
    fi
  done
  if [[ $(nodes) -ge $workers ]]; then
    echo "ray started: head pid $(cut -d' ' -f1 "$dir/head.pid"), $workers worker nodes," \
         "address $address"
    exit 0
  fi
  sleep 1
done
echo "ray: $(nodes) of $workers worker nodes joined in time; see $dir/*.log" >&2
exit 1
