#!/usr/bin/env bash
# Airflow 3 on Celery workers: the api-server (UI, REST API, and the execution API the workers'
# tasks call), scheduler and dag-processor, and N `airflow celery worker`s (concurrency 1 each),
# every one bound to 127.0.0.1 or listening nowhere: the scheduler and the workers run with
# --skip-serve-logs (Airflow's task-log server binds every interface); a task's log stays on
# its worker's disk (worker-N/airflow/logs). Idempotent: what runs is left running.
#
# Each worker is started as a separate host would be: its own working directory
# (worker-N/), AIRFLOW_HOME (worker-N/airflow) and RANKSTREAM_HOME (worker-N/home, unless
# RANKSTREAM_HOME is set here: then every worker shares it), its own hostname (-H worker-N,
# which its task instances record), and a minimal environment: besides the broker, the result
# backend and the api-server's URL, only the RANKSTREAM_*, AWS_*, NUMBA_*, AIRFLOW_CONN_*,
# AIRFLOW_VAR_* and AIRFLOW__* variables set when this runs (never the scheduler's JWT key nor
# the metadata DB's URL). Its main process imports the pipeline's modules before forking its
# pool (worker_preload.py), so that each task does not. A worker leads its own process group
# (setsid); Airflow runs each task in a group of its own below it, so losing that host means
# killing the worker's whole process tree (tests/multihost/celery_servers.py: lose_host).
#
#   RANKSTREAM_CELERY_WORKERS       how many workers (default 2)
#   RANKSTREAM_AIRFLOW_API_WORKERS  api-server processes (default 1)
#   and those of celery-env.sh (RANKSTREAM_CELERY_BROKER is required; PostgreSQL must run)
# Every process is recorded as "pid starttime" in run/NAME.pid; stop with celery-stop.sh.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# what a worker inherits: only what the caller set, before celery-env.sh adds the server side's
passed=$(compgen -e | grep -E '^(RANKSTREAM_|AWS_|NUMBA_|AIRFLOW_CONN_|AIRFLOW_VAR_|AIRFLOW__)' \
  | grep -vE '^AIRFLOW__(API_AUTH__JWT_SECRET|API__SECRET_KEY|DATABASE__SQL_ALCHEMY_CONN(_ASYNC)?)$' \
  || true)
. "$here/celery-env.sh"
workers=${RANKSTREAM_CELERY_WORKERS:-2}
[[ $workers =~ ^[1-9][0-9]*$ ]] \
  || { echo "RANKSTREAM_CELERY_WORKERS is '$workers', expected a positive count" >&2; exit 2; }
run_dir=$rs_celery_dir/run
mkdir -p "$run_dir"
export AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS=${AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS:-admin:admin}

running() {   # NAME: its pid file holds a live process with the recorded start time
  local pid started
  [[ -f $run_dir/$1.pid ]] && read -r pid started < "$run_dir/$1.pid" || return 1
  [[ $pid =~ ^[0-9]+$ ]] || return 1
  [[ $(sed 's/.*) //' "/proc/$pid/stat" 2>/dev/null | cut -d' ' -f20) == "$started" ]]
}
record() {    # NAME PID: "pid starttime" (a title can change, /proc/PID/stat's start time not)
  echo "$2 $(sed 's/.*) //' "/proc/$2/stat" | cut -d' ' -f20)" > "$run_dir/$1.pid"
}
start() {     # NAME ARGS...: airflow ARGS in its own process group, logging to run/NAME.log
  local name=$1; shift
  if running "$name"; then
    echo "$name already running (pid $(cut -d' ' -f1 "$run_dir/$name.pid"))"; return
  fi
  setsid nohup airflow "$@" > "$run_dir/$name.log" 2>&1 < /dev/null &
  record "$name" $!
  echo "$name started (pid $!, log $run_dir/$name.log)"
}
start_worker() {   # N
  local n=$1 name=worker-$1 wdir=$rs_celery_dir/worker-$1 var
  if running "$name"; then
    echo "$name already running (pid $(cut -d' ' -f1 "$run_dir/$name.pid"))"; return
  fi
  (umask 077 && mkdir -p "$wdir/airflow" "$wdir/home")
  local preload=worker_preload.CELERY_CONFIG
  local env=(PATH="$PATH" HOME="$HOME" LANG="${LANG:-C.UTF-8}")
  for var in $passed; do env+=("$var=${!var}"); done
  env+=(
    RANKSTREAM_HOME="${RANKSTREAM_HOME:-$wdir/home}"
    RANKSTREAM_CELERY_HOSTNAME="$name"
    PYTHONPATH="$here"                     # worker_hostname.py, worker_preload.py
    AIRFLOW_HOME="$wdir/airflow"
    AIRFLOW__CORE__HOSTNAME_CALLABLE=worker_hostname.hostname
    # Airflow's Celery config, and the pipeline's modules imported before the pool forks
    AIRFLOW__CELERY__CELERY_CONFIG_OPTIONS="${AIRFLOW__CELERY__CELERY_CONFIG_OPTIONS:-$preload}"
    AIRFLOW__CORE__EXECUTOR=CeleryExecutor
    AIRFLOW__CORE__DAGS_FOLDER="$AIRFLOW__CORE__DAGS_FOLDER"
    AIRFLOW__CORE__LOAD_EXAMPLES=False
    AIRFLOW__CORE__EXECUTION_API_SERVER_URL="$AIRFLOW__CORE__EXECUTION_API_SERVER_URL"
    AIRFLOW__API__BASE_URL="$AIRFLOW__API__BASE_URL"
    AIRFLOW__CELERY__BROKER_URL="$AIRFLOW__CELERY__BROKER_URL"
    AIRFLOW__CELERY__RESULT_BACKEND="$AIRFLOW__CELERY__RESULT_BACKEND"
    AIRFLOW__CELERY__WORKER_CONCURRENCY="$AIRFLOW__CELERY__WORKER_CONCURRENCY"
  )
  setsid nohup env -i -C "$wdir" "${env[@]}" airflow celery worker -H "$name" \
    --concurrency "$AIRFLOW__CELERY__WORKER_CONCURRENCY" --skip-serve-logs \
    --without-gossip --without-mingle > "$run_dir/$name.log" 2>&1 < /dev/null &
  record "$name" $!
  echo "$name started (pid $!, log $run_dir/$name.log, home $wdir)"
}
wait_for() {  # NAME SECONDS TEST...: until TEST passes; fails if NAME exits or time runs out
  local name=$1 seconds=$2; shift 2
  for _ in $(seq 1 $((seconds * 4))); do
    if "$@"; then return 0; fi
    if ! running "$name"; then
      echo "$name exited during start; last lines of $run_dir/$name.log:" >&2
      tail -n 20 "$run_dir/$name.log" >&2; return 1
    fi
    sleep 0.25
  done
  echo "$name was not ready within $seconds s; see $run_dir/$name.log" >&2; return 1
}
api_up() { curl -sf -o /dev/null "$AIRFLOW__API__BASE_URL/api/v2/monitor/health"; }
worker_up() { grep -q "celery@$1 ready" "$run_dir/$1.log"; }

if ! (exec 3<>"/dev/tcp/127.0.0.1/${RANKSTREAM_PG_PORT:-5433}") 2>/dev/null; then
  echo "PostgreSQL does not answer on 127.0.0.1:${RANKSTREAM_PG_PORT:-5433}:" \
    "run infra/postgres/start.sh first" >&2
  exit 1
fi
# the workers need only the broker and the result backend: they start while the DB migrates
for n in $(seq 1 "$workers"); do start_worker "$n"; done
if ! migrate=$(airflow db migrate 2>&1); then
  echo "airflow db migrate failed (the workers run: celery-stop.sh stops them):" >&2
  tail -n 20 <<< "$migrate" >&2; exit 1
fi
start api-server api-server --host 127.0.0.1 --port "$AIRFLOW__API__PORT" \
  --workers "${RANKSTREAM_AIRFLOW_API_WORKERS:-1}"
start scheduler scheduler --skip-serve-logs
start dag-processor dag-processor
wait_for api-server 180 api_up
for n in $(seq 1 "$workers"); do wait_for "worker-$n" 180 worker_up "worker-$n"; done
echo "airflow on celery: $AIRFLOW__API__BASE_URL, $workers workers (password for 'admin' in" \
  "$AIRFLOW_HOME/simple_auth_manager_passwords.json.generated)"
