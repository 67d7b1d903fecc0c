#!/usr/bin/env bash
# Start a local Redis Cluster of 6 redis-server processes (Debian package): 3 primaries and 3
# replicas on loopback ports BASE..BASE+5 (cluster bus: each port + 10000), formed with
# `redis-cli --cluster create --cluster-replicas 1`; waits until every node reports
# cluster_state:ok and every replica is linked to its primary. Idempotent. Stop it with
# cluster-stop.sh (by pid).
#
#   RANKSTREAM_REDIS_CLUSTER_PORT   first port (default 7000); BASE+5 and BASE+10005 must be free
#   RANKSTREAM_REDIS_CLUSTER_DIR    state dir (default ~/.local/state/rankstream/redis-cluster-BASE):
#                                   one sub-directory per node with its pid, log, nodes.conf
#   RANKSTREAM_REDIS_CLUSTER_NODE_TIMEOUT   cluster-node-timeout in ms (default 1000: a primary
#                                   that stops answering is failed over within a few seconds)
set -euo pipefail
. "$(dirname "$0")/../state.sh"
base=${RANKSTREAM_REDIS_CLUSTER_PORT:-7000}
dir=${RANKSTREAM_REDIS_CLUSTER_DIR:-$(rs_state_dir "redis-cluster-$base")}
timeout_ms=${RANKSTREAM_REDIS_CLUSTER_NODE_TIMEOUT:-1000}
ports=$(seq "$base" $((base + 5)))

if ! command -v redis-server >/dev/null && [[ ! -x /usr/bin/redis-server ]]; then
  echo "redis-server is not installed; run: sudo apt-get install redis-server" >&2
  exit 1
fi
server=$(rs_redis redis-server)
cli=$(rs_redis redis-cli)
ask() { "$cli" -h 127.0.0.1 -p "$1" "${@:2}" 2>/dev/null; }
ours() {  # the pid in the node's pid file is alive and is a redis-server on that port
  local pidfile=$dir/$1/redis.pid pid
  [[ -f $pidfile ]] || return 1
  pid=$(cat "$pidfile")
  [[ $pid =~ ^[0-9]+$ ]] || return 1
  tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | grep -Eq -- "redis-server .*:$1( |\$)"
}
healthy() {  # every node answers with cluster_state:ok, 3 primaries each with a linked replica
  local port
  for port in $ports; do
    ask "$port" cluster info | grep -q '^cluster_state:ok' || return 1
  done
  [[ $(ask "$base" cluster nodes | grep -c 'master.* connected') -eq 3 ]] || return 1
  [[ $(ask "$base" cluster nodes | grep -c 'slave.* connected') -eq 3 ]] || return 1
  for port in $ports; do
    if ask "$port" role | head -1 | grep -q slave; then
      ask "$port" info replication | grep -q '^master_link_status:up' || return 1
    fi
  done
}

running=0
for port in $ports; do ours "$port" && running=$((running + 1)); done
if [[ $running -eq 6 ]] && healthy; then
  echo "redis cluster already running: 127.0.0.1:$base-$((base + 5)) (state in $dir)"
  exit 0
fi
if [[ $running -gt 0 ]]; then
  echo "a partial redis cluster runs from $dir ($running of 6 nodes); stop it with" \
       "cluster-stop.sh first" >&2
  exit 1
fi
for port in $ports; do
  if ask "$port" ping | grep -q PONG; then
    echo "port 127.0.0.1:$port is taken by another redis; set RANKSTREAM_REDIS_CLUSTER_PORT" >&2
    exit 1
  fi
done

(umask 077 && mkdir -p "$dir")
for port in $ports; do
  node=$dir/$port
  (umask 077 && mkdir -p "$node")
  rm -f "$node/nodes.conf"    # a fresh cluster every start (no persistence, like start.sh)
  "$server" --bind 127.0.0.1 --port "$port" --protected-mode yes --save '' --appendonly no \
    --cluster-enabled yes --cluster-config-file "$node/nodes.conf" \
    --cluster-node-timeout "$timeout_ms" --cluster-replica-validity-factor 0 \
    --dir "$node" --daemonize yes --pidfile "$node/redis.pid" --logfile "$node/redis.log"
done
for port in $ports; do
  for _ in $(seq 1 100); do ask "$port" ping | grep -q PONG && break; sleep 0.1; done
  ask "$port" ping | grep -q PONG || {
    echo "redis node 127.0.0.1:$port did not answer within 10 s; see $dir/$port/redis.log" >&2
    exit 1
  }
done
nodes=()
for port in $ports; do nodes+=("127.0.0.1:$port"); done
if ! out=$("$cli" --cluster create "${nodes[@]}" --cluster-replicas 1 --cluster-yes 2>&1); then
  echo "redis-cli --cluster create failed:" >&2
  echo "$out" >&2
  exit 1
fi
for _ in $(seq 1 300); do
  if healthy; then
    echo "redis cluster started: 3 primaries + 3 replicas on 127.0.0.1:$base-$((base + 5))" \
         "(pids in $dir/*/redis.pid)"
    exit 0
  fi
  sleep 0.1
done
echo "redis cluster did not reach cluster_state:ok within 30 s; see $dir/*/redis.log" >&2
exit 1
