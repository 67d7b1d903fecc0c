#!/usr/bin/env bash
# Start a real redis-server (Debian package; installed if missing and we are root) bound to
# 127.0.0.1, without persistence. Idempotent; waits until it answers PING.
#
#   RANKSTREAM_REDIS_PORT   port (default 6379)
#   RANKSTREAM_REDIS_DIR    state dir (default ~/.local/state/rankstream/redis-$PORT): pid, log
# Runs Debian's /usr/bin/redis-server (see infra/state.sh for why not the venv's).
set -euo pipefail
. "$(dirname "$0")/../state.sh"
port=${RANKSTREAM_REDIS_PORT:-6379}
dir=${RANKSTREAM_REDIS_DIR:-$(rs_state_dir "redis-$port")}
pidfile=$dir/redis.pid

if ! command -v redis-server >/dev/null; then
  if [[ $(id -u) -eq 0 ]]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q redis-server >/dev/null \
      || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q redis-server >/dev/null; }
  else
    echo "redis-server is not installed; run: sudo apt-get install redis-server" >&2
    exit 1
  fi
fi
# The Debian package starts a system-wide service on 6379 where systemd runs; we never use it.

server=$(rs_redis redis-server)
cli=$(rs_redis redis-cli)
ping() { "$cli" -h 127.0.0.1 -p "$port" ping 2>/dev/null | grep -q PONG; }

if [[ -f $pidfile ]] && kill -0 "$(cat "$pidfile")" 2>/dev/null && ping; then
  echo "redis already running: pid $(cat "$pidfile"), 127.0.0.1:$port"
  exit 0
fi
if ping; then
  echo "port 127.0.0.1:$port is taken by another redis; set RANKSTREAM_REDIS_PORT" >&2
  exit 1
fi
(umask 077 && mkdir -p "$dir")
"$server" --bind 127.0.0.1 --port "$port" --protected-mode yes --save '' --appendonly no \
  --dir "$dir" --daemonize yes --pidfile "$pidfile" --logfile "$dir/redis.log"
for _ in $(seq 1 100); do
  if ping; then echo "redis started: pid $(cat "$pidfile"), 127.0.0.1:$port"; exit 0; fi
  sleep 0.1
done
echo "redis did not answer on 127.0.0.1:$port within 10 s; see $dir/redis.log" >&2
exit 1
