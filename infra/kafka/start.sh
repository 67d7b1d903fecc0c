#!/usr/bin/env bash
# Start a real Apache Kafka 4.x broker in KRaft mode (one combined broker+controller), bound to
# 127.0.0.1, from the jars on Maven Central. Idempotent: if the broker of this port already runs,
# it says so and exits 0. Waits until the broker answers on its port. The broker's data (topics,
# offsets, committed group offsets) survives a restart; `start.sh --fresh` wipes it first.
#
#   RANKSTREAM_KAFKA_PORT   client port (default 9092); the controller uses port+1
#   RANKSTREAM_KAFKA_DIR    state dir (default ~/.local/state/rankstream/kafka-$PORT): pid, logs, data
#   RANKSTREAM_KAFKA_LIBS   jar cache (default ~/.cache/rankstream/kafka-libs)
#   RANKSTREAM_KAFKA_HEAP   JVM heap (default 512m)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../state.sh"
fresh=$(rs_fresh "$@")
port=${RANKSTREAM_KAFKA_PORT:-9092}
cport=$((port + 1))
dir=${RANKSTREAM_KAFKA_DIR:-$(rs_state_dir "kafka-$port")}
libs=${RANKSTREAM_KAFKA_LIBS:-$HOME/.cache/rankstream/kafka-libs}
heap=${RANKSTREAM_KAFKA_HEAP:-512m}
pidfile=$dir/kafka.pid

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

if [[ -f $pidfile ]] && kill -0 "$(cat "$pidfile")" 2>/dev/null && port_open "$port"; then
  echo "kafka already running: pid $(cat "$pidfile"), 127.0.0.1:$port"
  exit 0
fi
if port_open "$port"; then
  echo "port 127.0.0.1:$port is taken by another process; set RANKSTREAM_KAFKA_PORT" >&2
  exit 1
fi

"$here/fetch.sh" "$libs"

if [[ $fresh == 1 ]]; then rm -rf "$dir"; fi
(umask 077 && mkdir -p "$dir/data" "$dir/logs")
cat > "$dir/server.properties" <<PROPS
process.roles=broker,controller
node.id=1
controller.quorum.bootstrap.servers=127.0.0.1:$cport
listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$cport
advertised.listeners=PLAINTEXT://127.0.0.1:$port
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
log.dirs=$dir/data
num.partitions=1
offsets.topic.replication.factor=1
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=true
message.max.bytes=4194304
PROPS

java_opts=(-Xms128m "-Xmx$heap" -XX:+UseG1GC -Djava.awt.headless=true
  "-Dkafka.logs.dir=$dir/logs" "-Dlog4j2.configurationFile=$here/log4j2.properties")
cp="$libs/*"
if [[ ! -f $dir/data/meta.properties ]]; then   # a new data dir: format it once
  cluster_id=$(java -cp "$cp" "${java_opts[@]}" kafka.tools.StorageTool random-uuid 2>/dev/null \
    | tail -n 1)
  java -cp "$cp" "${java_opts[@]}" kafka.tools.StorageTool format --standalone \
    -t "$cluster_id" -c "$dir/server.properties" > "$dir/logs/format.log" 2>&1
fi

# the last run's log would say "started" before this broker does
if [[ -f $dir/logs/server.log ]]; then mv "$dir/logs/server.log" "$dir/logs/server.log.1"; fi
nohup java -cp "$cp" "${java_opts[@]}" kafka.Kafka "$dir/server.properties" \
  > "$dir/logs/stdout.log" 2>&1 < /dev/null &
echo $! > "$pidfile"

for _ in $(seq 1 240); do
  if ! kill -0 "$(cat "$pidfile")" 2>/dev/null; then
    echo "kafka exited during start; last lines of $dir/logs:" >&2
    tail -n 30 "$dir/logs/stdout.log" "$dir/logs/server.log" >&2 || true
    exit 1
  fi
  if port_open "$port" && grep -q "Kafka Server started" "$dir/logs/server.log" 2>/dev/null; then
    echo "kafka started: pid $(cat "$pidfile"), 127.0.0.1:$port, state in $dir"
    exit 0
  fi
  sleep 0.25
done
echo "kafka did not answer on 127.0.0.1:$port within 60 s; see $dir/logs" >&2
exit 1
