#!/usr/bin/env bash
# stop_pid.sh NAME PIDFILE GRACE_SECONDS COMMAND_PATTERN: SIGTERM the process in PIDFILE, wait,
# then SIGKILL; but only if it is the process that was started: the pid file's second field, when
# there is one, is the process's start time (field 22 of /proc/PID/stat, which a process cannot
# change, unlike its title: Airflow's api-server renames itself), else its command line
# (/proc/PID/cmdline) must match COMMAND_PATTERN (an extended regex). A stale pid file whose pid
# now belongs to another process is removed, and that process left alone. Idempotent: a missing
# pidfile or a dead process is not an error.
set -euo pipefail
name=$1 pidfile=$2 grace=${3:-10} pattern=${4:?"stop_pid.sh needs the command pattern of $1"}
if [[ ! -f $pidfile ]]; then echo "$name: not running (no $pidfile)"; exit 0; fi
read -r pid started < "$pidfile" || true
if [[ ! $pid =~ ^[0-9]+$ ]]; then
  echo "$name: $pidfile holds no pid; removed" >&2; rm -f "$pidfile"; exit 0
fi
cmdline=$({ tr '\0' ' ' < "/proc/$pid/cmdline"; } 2>/dev/null || true)   # gone: no message
if [[ -z $cmdline ]]; then
  echo "$name: not running (pid $pid is gone)"; rm -f "$pidfile"; exit 0
fi
if [[ -n ${started:-} ]]; then
  # field 22 counted after the ")" that ends the process name (a name may hold spaces)
  now=$(sed 's/.*) //' "/proc/$pid/stat" 2>/dev/null | cut -d' ' -f20 || true)
  ours=$([[ $now == "$started" ]] && echo yes || echo no)
else
  ours=$(grep -Eq -- "$pattern" <<< "$cmdline" && echo yes || echo no)
fi
if [[ $ours != yes ]]; then
  echo "$name: pid $pid in $pidfile is another program ($cmdline); not touching it" >&2
  rm -f "$pidfile"
  exit 0
fi
kill -TERM "$pid"
for _ in $(seq 1 $((grace * 10))); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid"; echo "$name: pid $pid killed"; fi
rm -f "$pidfile"
echo "$name: stopped (pid $pid)"
