#!/usr/bin/env bash
# stop_pid.sh NAME PIDFILE GRACE_SECONDS COMMAND_PATTERN: SIGTERM the process in PIDFILE, wait,
# then SIGKILL; but only if its command line (/proc/PID/cmdline) matches COMMAND_PATTERN (an
# extended regex). A stale pid file whose pid now belongs to another process is removed, and that
# process left alone. Idempotent: a missing pidfile or a dead process is not an error.
set -euo pipefail
name=$1 pidfile=$2 grace=${3:-10} pattern=${4:?"stop_pid.sh needs the command pattern of $1"}
if [[ ! -f $pidfile ]]; then echo "$name: not running (no $pidfile)"; exit 0; fi
pid=$(cat "$pidfile")
if [[ ! $pid =~ ^[0-9]+$ ]]; then
  echo "$name: $pidfile holds no pid; removed" >&2; rm -f "$pidfile"; exit 0
fi
cmdline=$(tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null || true)
if [[ -z $cmdline ]]; then
  echo "$name: not running (pid $pid is gone)"; rm -f "$pidfile"; exit 0
fi
if ! grep -Eq -- "$pattern" <<< "$cmdline"; then
  echo "$name: pid $pid in $pidfile is another program ($cmdline); not touching it" >&2
  rm -f "$pidfile"
  exit 0
fi
kill -TERM "$pid"
for _ in $(seq 1 $((grace * 10))); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid"; echo "$name: pid $pid killed"; fi
rm -f "$pidfile"
echo "$name: stopped (pid $pid)"
