#!/usr/bin/env bash
# stop_pid.sh NAME PIDFILE GRACE_SECONDS: SIGTERM the process in PIDFILE, wait, then SIGKILL.
# Idempotent: a missing pidfile or a dead process is not an error.
set -euo pipefail
name=$1 pidfile=$2 grace=${3:-10}
if [[ ! -f $pidfile ]]; then echo "$name: not running (no $pidfile)"; exit 0; fi
pid=$(cat "$pidfile")
if kill -0 "$pid" 2>/dev/null; then
  kill -TERM "$pid"
  for _ in $(seq 1 $((grace * 10))); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid"; echo "$name: pid $pid killed"; fi
fi
rm -f "$pidfile"
echo "$name: stopped (pid $pid)"
