#!/usr/bin/env bash
# Stop what celery-start.sh started, by process id: the workers first (a warm shutdown: a
# running task may finish within the grace period), then the dag-processor, scheduler and
# api-server. Each only if its pid file's "pid starttime" is still that process (stop_pid.sh);
# then what is left of its process tree is killed: its process group (a worker's pool) and the
# descendants it had when the stop began (a task runs in a process group of its own), each
# only if its start time is still the one seen then. Idempotent.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../state.sh"
run_dir=${RANKSTREAM_CELERY_DIR:-$(rs_state_dir airflow-celery)}/run
started_at() { sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f20; }
descendants() {   # PID: "pid starttime" of every process below PID
  ps -e -o pid=,ppid= | awk -v root="$1" '
    { kids[$2] = kids[$2] " " $1 }
    END { n = split(kids[root], todo, " ")
          while (n > 0) { p = todo[n--]; print p; m = split(kids[p], more, " ")
                          for (i = 1; i <= m; i++) todo[++n] = more[i] } }' |
    while read -r pid; do echo "$pid $(started_at "$pid")"; done
}
stop() {   # NAME GRACE PATTERN
  local name=$1 pidfile=$run_dir/$1.pid pid= started= tree= child when
  [[ -f $pidfile ]] && read -r pid started < "$pidfile" || true
  if [[ $pid =~ ^[0-9]+$ && ! -e /proc/$pid ]]; then   # lost (a killed worker): nothing to do
    echo "$name: not running (pid $pid is gone)"; rm -f "$pidfile"; return 0
  fi
  if [[ $pid =~ ^[0-9]+$ && -n $started && $(started_at "$pid") == "$started" ]]; then
    tree=$(descendants "$pid")
  fi
  "$here/../stop_pid.sh" "$name" "$pidfile" "$2" "$3"
  [[ -n $tree ]] || return 0
  # the leader was ours, so its group is (a group id is not reused while it has members)
  kill -KILL -- "-$pid" 2>/dev/null && echo "$name: killed what was left of process group $pid"
  while read -r child when; do
    if [[ -n $when && $(started_at "$child") == "$when" ]] && kill -KILL "$child" 2>/dev/null
    then echo "$name: killed its leftover process $child"; fi
  done <<< "$tree"
}
for pidfile in "$run_dir"/worker-*.pid; do   # the workers side by side, then the servers
  [[ -e $pidfile ]] && stop "$(basename "$pidfile" .pid)" 20 "airflow celery worker" &
done
wait
for name in dag-processor scheduler api-server; do stop "$name" 20 "airflow $name" & done
wait
