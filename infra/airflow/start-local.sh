#!/usr/bin/env bash
# Run Airflow 3's scheduler, dag-processor and api-server for a person who wants the UI,
# all bound to 127.0.0.1. The scheduler is started with --skip-serve-logs: its log server would
# listen on every interface ([::]:8793); the api-server reads task logs from the local disk.
# (Don't use `airflow standalone` unisolated: it serves task logs on all interfaces.)
# Stop with infra/airflow/stop-local.sh (by pid). UI: http://127.0.0.1:${RANKSTREAM_AIRFLOW_PORT:-8080}
set -euo pipefail
. "$(dirname "$0")/env.sh"
# simple auth manager: a local admin user with a generated password, printed once
export AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS=${AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS:-admin:admin}
airflow db migrate >/dev/null
run_dir=$AIRFLOW_HOME/run
mkdir -p "$run_dir"
start() {
  local name=$1; shift
  if [[ -f $run_dir/$name.pid ]] && kill -0 "$(cut -d' ' -f1 "$run_dir/$name.pid")" 2>/dev/null
  then
    echo "$name already running (pid $(cut -d' ' -f1 "$run_dir/$name.pid"))"; return
  fi
  nohup airflow "$@" > "$run_dir/$name.log" 2>&1 < /dev/null &
  # pid and start time: the api-server renames its process, so its command line cannot tell
  # stop-local.sh that it is ours; /proc/PID/stat's start time can
  echo "$! $(sed 's/.*) //' "/proc/$!/stat" | cut -d' ' -f20)" > "$run_dir/$name.pid"
  echo "$name started (pid $!, log $run_dir/$name.log)"
}
start api-server api-server --host 127.0.0.1 --port "$AIRFLOW__API__PORT"
start scheduler scheduler --skip-serve-logs
start dag-processor dag-processor
echo "UI: $AIRFLOW__API__BASE_URL (password for 'admin' in $AIRFLOW_HOME/simple_auth_manager_passwords.json.generated)"
