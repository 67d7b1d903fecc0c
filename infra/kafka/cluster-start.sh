#!/usr/bin/env bash
# Start a local replicated Kafka 4.x cluster in KRaft mode: 3 nodes, each broker and controller
# (a static quorum of 3 voters), bound to 127.0.0.1, topics created with replication factor 3
# and min.insync.replicas 2, so that an event a producer had acknowledged (acks=all, the
# producer's default) survives any one broker's death. Idempotent: a running healthy cluster is
# left alone. Waits until every broker answers. Stop it with cluster-stop.sh (by pid).
#
#   RANKSTREAM_KAFKA_CLUSTER_PORT   first port (default 19092): clients on BASE..BASE+2,
#                                   controllers on BASE+3..BASE+5
#   RANKSTREAM_KAFKA_CLUSTER_DIR    state dir (default ~/.local/state/rankstream/kafka-cluster-BASE):
#                                   node-1..3 with each broker's pid, logs and data
#   RANKSTREAM_KAFKA_LIBS           jar cache (default ~/.cache/rankstream/kafka-libs)
#   RANKSTREAM_KAFKA_HEAP           JVM heap per broker (default 384m)
#   cluster-start.sh --node N       (re)start node N alone (after a test killed it)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../state.sh"
base=${RANKSTREAM_KAFKA_CLUSTER_PORT:-19092}
dir=${RANKSTREAM_KAFKA_CLUSTER_DIR:-$(rs_state_dir "kafka-cluster-$base")}
libs=${RANKSTREAM_KAFKA_LIBS:-$HOME/.cache/rankstream/kafka-libs}
heap=${RANKSTREAM_KAFKA_HEAP:-384m}
nodes=(1 2 3)
if [[ ${1:-} == --node ]]; then nodes=("${2:?--node needs 1, 2 or 3}"); fi

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
client_port() { echo $((base + $1 - 1)); }
controller_port() { echo $((base + $1 + 2)); }
ours() {  # node N's pid file names a live kafka.Kafka of this node's properties
  local pidfile=$dir/node-$1/kafka.pid pid
  [[ -f $pidfile ]] || return 1
  pid=$(cat "$pidfile")
  [[ $pid =~ ^[0-9]+$ ]] || return 1
  tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | grep -q -- "kafka.Kafka $dir/node-$1/"
}

"$here/fetch.sh" "$libs"
voters=""
for n in 1 2 3; do voters+="${voters:+,}$n@127.0.0.1:$(controller_port "$n")"; done
java_opts=(-Xms128m "-Xmx$heap" -XX:+UseG1GC -XX:TieredStopAtLevel=1 -Djava.awt.headless=true
  "-Dlog4j2.configurationFile=$here/log4j2.properties")
cp="$libs/*"
(umask 077 && mkdir -p "$dir")
cluster_id_file=$dir/cluster.id
if [[ ! -f $cluster_id_file ]]; then
  java -cp "$cp" "${java_opts[@]}" "-Dkafka.logs.dir=$dir" kafka.tools.StorageTool random-uuid \
    2>/dev/null | tail -n 1 > "$cluster_id_file"
fi

for n in "${nodes[@]}"; do
  node=$dir/node-$n port=$(client_port "$n") cport=$(controller_port "$n")
  if ours "$n" && port_open "$port"; then continue; fi
  for p in "$port" "$cport"; do
    if port_open "$p"; then
      echo "port 127.0.0.1:$p is taken by another process; set RANKSTREAM_KAFKA_CLUSTER_PORT" >&2
      exit 1
    fi
  done
  (umask 077 && mkdir -p "$node/data" "$node/logs")
  cat > "$node/server.properties" <<PROPS
process.roles=broker,controller
node.id=$n
controller.quorum.voters=$voters
listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$cport
advertised.listeners=PLAINTEXT://127.0.0.1:$port
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
log.dirs=$node/data
num.partitions=1
default.replication.factor=3
min.insync.replicas=2
offsets.topic.replication.factor=3
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=3
transaction.state.log.min.isr=2
share.coordinator.state.topic.replication.factor=3
share.coordinator.state.topic.min.isr=2
unclean.leader.election.enable=false
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=true
message.max.bytes=4194304
PROPS
  if [[ ! -f $node/data/meta.properties ]]; then   # a new data dir: format it once
    java -cp "$cp" "${java_opts[@]}" "-Dkafka.logs.dir=$node/logs" kafka.tools.StorageTool format \
      -t "$(cat "$cluster_id_file")" -c "$node/server.properties" > "$node/logs/format.log" 2>&1
  fi
  if [[ -f $node/logs/server.log ]]; then mv "$node/logs/server.log" "$node/logs/server.log.1"; fi
  nohup java -cp "$cp" "${java_opts[@]}" "-Dkafka.logs.dir=$node/logs" kafka.Kafka \
    "$node/server.properties" > "$node/logs/stdout.log" 2>&1 < /dev/null &
  echo $! > "$node/kafka.pid"
done

for _ in $(seq 1 480); do
  up=0
  for n in "${nodes[@]}"; do
    node=$dir/node-$n
    if ! kill -0 "$(cat "$node/kafka.pid")" 2>/dev/null; then
      echo "kafka node $n exited during start; last lines of $node/logs:" >&2
      tail -n 30 "$node/logs/stdout.log" "$node/logs/server.log" >&2 || true
      exit 1
    fi
    if port_open "$(client_port "$n")" && grep -q "Kafka Server started" \
        "$node/logs/server.log" 2>/dev/null; then up=$((up + 1)); fi
  done
  if [[ $up -eq ${#nodes[@]} ]]; then
    bootstrap="127.0.0.1:$(client_port 1),127.0.0.1:$(client_port 2),127.0.0.1:$(client_port 3)"
    echo "kafka cluster up: $bootstrap (replication 3, min.insync.replicas 2), state in $dir"
    exit 0
  fi
  sleep 0.25
done
echo "the kafka cluster did not answer within 120 s; see $dir/node-*/logs" >&2
exit 1
