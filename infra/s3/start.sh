#!/usr/bin/env bash
# Start a real S3-compatible server on 127.0.0.1: SeaweedFS's `weed server -s3` (master, volume
# server, filer and S3 gateway in one process), built by build.sh. Idempotent: if this port's
# server runs, it says so and exits 0. Waits until the S3 port answers. Its data survives a
# restart; `start.sh --fresh` wipes it first. The access key and secret are generated once and
# kept in the state dir (mode 0600), where tests and clients read them (credentials.env).
#
#   RANKSTREAM_S3_PORT   S3 port (default 8333); master, volume and filer use PORT+1..PORT+3,
#                        and each of the four its port + 10000 for gRPC
#   RANKSTREAM_S3_DIR    state dir (default ~/.local/state/rankstream/s3-$PORT): pid, logs, data
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../state.sh"
fresh=$(rs_fresh "$@")
port=${RANKSTREAM_S3_PORT:-8333}
dir=${RANKSTREAM_S3_DIR:-$(rs_state_dir "s3-$port")}
pidfile=$dir/weed.pid
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

if [[ -f $pidfile ]] && kill -0 "$(cut -d' ' -f1 "$pidfile")" 2>/dev/null && port_open "$port"; then
  echo "s3 already running: pid $(cut -d' ' -f1 "$pidfile"), http://127.0.0.1:$port"
  exit 0
fi
for p in "$port" $((port + 1)) $((port + 2)) $((port + 3)); do
  if port_open "$p" || port_open $((p + 10000)); then
    echo "port 127.0.0.1:$p (or $((p + 10000))) is taken; set RANKSTREAM_S3_PORT" >&2
    exit 1
  fi
done
weed=$("$here/build.sh")
if [[ $fresh == 1 ]]; then rm -rf "$dir"; fi
(umask 077 && mkdir -p "$dir/data" "$dir/logs")
if [[ ! -f $dir/credentials.env ]]; then
  (umask 077 && printf 'AWS_ACCESS_KEY_ID=rs%s\nAWS_SECRET_ACCESS_KEY=%s\n' \
    "$(head -c 8 /dev/urandom | od -An -tx1 | tr -d ' \n')" \
    "$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')" > "$dir/credentials.env")
fi
. "$dir/credentials.env"
(umask 077 && cat > "$dir/s3.json" <<JSON
{"identities": [{"name": "rankstream",
  "credentials": [{"accessKey": "$AWS_ACCESS_KEY_ID", "secretKey": "$AWS_SECRET_ACCESS_KEY"}],
  "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}
JSON
)
nohup "$weed" -logdir="$dir/logs" -alsologtostderr=false server -ip=127.0.0.1 -ip.bind=127.0.0.1 -dir="$dir/data" \
  -master.port=$((port + 1)) -volume.port=$((port + 2)) -filer -filer.port=$((port + 3)) \
  -s3 -s3.port="$port" -s3.config="$dir/s3.json" -s3.port.iceberg=0 -s3.port.lance=0 \
  -master.volumeSizeLimitMB=64 -volume.max=0 \
  > "$dir/logs/stdout.log" 2>&1 < /dev/null &
pid=$!
# the pid and its start time (field 22 of /proc/PID/stat): stop_pid.sh signals only that process
echo "$pid $(sed 's/.*) //' "/proc/$pid/stat" | cut -d' ' -f20)" > "$pidfile"
for _ in $(seq 1 240); do
  if ! kill -0 "$pid" 2>/dev/null; then
    echo "the s3 server exited during start; last lines of $dir/logs/stdout.log:" >&2
    tail -n 30 "$dir/logs/stdout.log" >&2 || true
    exit 1
  fi
  # the gateway answers an unsigned request with an S3 error document once the filer is up
  if curl -s "http://127.0.0.1:$port/" 2>/dev/null | grep -q "<Error>\|ListAllMyBuckets"; then
    echo "s3 started: pid $pid, http://127.0.0.1:$port, state in $dir (credentials.env)"
    exit 0
  fi
  sleep 0.25
done
echo "the s3 server did not answer on 127.0.0.1:$port within 60 s; see $dir/logs" >&2
exit 1
