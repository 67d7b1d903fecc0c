# Source this file: Airflow 3 with the CeleryExecutor, for a shell or celery-start.sh. The
# metadata DB and Celery's task results live in the PostgreSQL of infra/postgres (start it
# first), Celery's broker is a Redis; the api-server, scheduler and dag-processor run with the
# private AIRFLOW_HOME below. env.sh (LocalExecutor, SQLite) stays what start-local.sh uses.
#   . infra/airflow/celery-env.sh     (then: airflow dags list, airflow tasks states-for-dag-run)
#   RANKSTREAM_CELERY_BROKER   Celery's broker URL (required), e.g. redis://127.0.0.1:6379/1
#   RANKSTREAM_CELERY_DIR      state dir (default ~/.local/state/rankstream/airflow-celery, mode
#                              0700): airflow/ (AIRFLOW_HOME), run/ (pid files and logs),
#                              worker-N/ (each worker's working directory), secrets.env
#   RANKSTREAM_PG_PORT, RANKSTREAM_PG_DIR   the cluster of infra/postgres/start.sh
#   RANKSTREAM_AIRFLOW_PORT    the api-server's port on 127.0.0.1 (default 8080)
# Sets rs_celery_dir (not exported) for the scripts.
_here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$_here/../state.sh"
rs_celery_dir=${RANKSTREAM_CELERY_DIR:-$(rs_state_dir airflow-celery)}
# env.sh: the DAG folder, no examples, the api-server on 127.0.0.1, the venv on PATH, umask 077;
# its AIRFLOW_HOME is replaced by ours (and its default home is not created)
RANKSTREAM_AIRFLOW_HOME=$rs_celery_dir/airflow . "$_here/env.sh"
chmod 700 "$rs_celery_dir"
_pg_port=${RANKSTREAM_PG_PORT:-5433}
_pg_dir=${RANKSTREAM_PG_DIR:-$(rs_state_dir "postgres-$_pg_port")}
if [[ ! -s $_pg_dir/password ]]; then
  echo "no PostgreSQL password in $_pg_dir: run infra/postgres/start.sh first" >&2
  unset _here _pg_port _pg_dir; return 1
fi
if [[ -z ${RANKSTREAM_CELERY_BROKER:-} ]]; then
  echo "RANKSTREAM_CELERY_BROKER is not set (Celery's broker, e.g. redis://127.0.0.1:6379/1)" >&2
  unset _here _pg_port _pg_dir; return 1
fi
_pg_url="airflow:$(cat "$_pg_dir/password")@127.0.0.1:$_pg_port/airflow"
export AIRFLOW__CORE__EXECUTOR=CeleryExecutor
# psycopg (3) for all three: SQLAlchemy's psycopg dialect is also the async driver Airflow 3's
# api-server needs (the default async URL would ask for asyncpg)
export AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=postgresql+psycopg://$_pg_url
export AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC=postgresql+psycopg://$_pg_url
export AIRFLOW__CELERY__RESULT_BACKEND=db+postgresql+psycopg://$_pg_url
export AIRFLOW__CELERY__BROKER_URL=$RANKSTREAM_CELERY_BROKER
export AIRFLOW__CELERY__WORKER_CONCURRENCY=${AIRFLOW__CELERY__WORKER_CONCURRENCY:-1}
# the scheduler signs the tasks' tokens and the api-server checks them: one key for both,
# generated once (the workers never see it)
if [[ ! -s $rs_celery_dir/secrets.env ]]; then
  (umask 077 && printf 'AIRFLOW__API_AUTH__JWT_SECRET=%s\nAIRFLOW__API__SECRET_KEY=%s\n' \
    "$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')" \
    "$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')" > "$rs_celery_dir/secrets.env")
fi
set -a; . "$rs_celery_dir/secrets.env"; set +a
unset _here _pg_port _pg_dir _pg_url
