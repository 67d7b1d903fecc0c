#!/usr/bin/env bash
# Start `rankstream refresh` for the models named (default: every configured model) in the
# background: it keeps each model's users' answers fresh between retrains (its own consumer
# group per model, rankstream.refresh.<model>). Idempotent: if the refresher of these models
# already runs, it says so and exits 0. Stop it with infra/refresh/stop.sh (same arguments).
#
#   infra/refresh/start.sh [MODEL ...]
#
#   RANKSTREAM_KAFKA_BOOTSTRAP   the Kafka brokers (required)
#   RANKSTREAM_REDIS_URL         the served Redis (required)
#   RANKSTREAM_CONFIG            the models' TOML file (required, e.g. dags/models.toml)
#   RANKSTREAM_HOME, RANKSTREAM_STORE, RANKSTREAM_NAMESPACE   as for every rankstream command
#   RANKSTREAM_REFRESH_BATCH_MS  recompute touched users every this many ms (default 200)
#   RANKSTREAM_REFRESH_DIR       state dir (default ~/.local/state/rankstream/refresh-NAME,
#                                NAME the models joined by '+', or 'all'): pid file, log
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../state.sh"
repo=$(cd "$here/../.." && pwd)
for var in RANKSTREAM_KAFKA_BOOTSTRAP RANKSTREAM_REDIS_URL RANKSTREAM_CONFIG; do
  if [[ -z ${!var:-} ]]; then
    echo "refresh: set $var (the refresher reads Kafka, writes the served Redis and needs" \
         "the models' config)" >&2
    exit 2
  fi
done
for model in "$@"; do
  if [[ ! $model =~ ^[A-Za-z0-9][A-Za-z0-9._-]*$ ]]; then
    echo "refresh: '$model' is not a model name" >&2; exit 2
  fi
done
name=all
if (($#)); then name=$(IFS=+; echo "$*"); fi
dir=${RANKSTREAM_REFRESH_DIR:-$(rs_state_dir "refresh-$name")}
pidfile=$dir/refresh.pid
log=$dir/refresh.log
rankstream=$repo/.venv/bin/rankstream
[[ -x $rankstream ]] || rankstream=$(command -v rankstream) \
  || { echo "refresh: no rankstream (run infra/setup.sh)" >&2; exit 1; }

if [[ -f $pidfile ]]; then
  read -r pid started < "$pidfile" || true
  now=$(sed 's/.*) //' "/proc/${pid:-0}/stat" 2>/dev/null | cut -d' ' -f20 || true)
  if [[ -n ${pid:-} && -n $now && $now == "${started:-}" ]]; then
    echo "refresh already running: pid $pid ($name), log $log"
    exit 0
  fi
fi
(umask 077 && mkdir -p "$dir")
echo "--- $(date -Is) rankstream refresh $*" >> "$log"
offset=$(stat -c %s "$log")
nohup "$rankstream" refresh "$@" --batch-ms "${RANKSTREAM_REFRESH_BATCH_MS:-200}" \
  >> "$log" 2>&1 < /dev/null &
pid=$!
# pid and start time: stop.sh stops this process only if /proc says it is the one started here
echo "$pid $(sed 's/.*) //' "/proc/$pid/stat" | cut -d' ' -f20)" > "$pidfile"
# a wrong config or a missing setting ends it at once: say so here, not only in the log (it
# waits for Kafka and Redis, saying so in its log, rather than exit)
for _ in $(seq 1 300); do
  if ! kill -0 "$pid" 2>/dev/null; then
    rm -f "$pidfile"
    echo "refresh exited during start; its output:" >&2
    tail -c +$((offset + 1)) "$log" | tail -n 20 >&2
    exit 1
  fi
  if tail -c +$((offset + 1)) "$log" | grep -q "^rankstream refresh: .*Ctrl-C stops"; then
    echo "refresh started: pid $pid ($name), log $log"
    exit 0
  fi
  sleep 0.1
done
echo "refresh still starting after 30 s: pid $pid ($name), log $log"
