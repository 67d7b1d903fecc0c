# Source this file: a private Airflow 3 home with a SQLite metadata DB and rankstream's DAGs.
#   . infra/airflow/env.sh     (then: airflow db migrate; airflow dags test rankstream_altsvm)
#   RANKSTREAM_AIRFLOW_HOME    default ~/.local/state/rankstream/airflow (mode 0700: a shared
#                              /tmp home would let another user plant plugins or DAGs there)
_repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
. "$_repo/infra/state.sh"
umask 077   # the metadata DB, logs and generated passwords are not world-readable
export AIRFLOW_HOME=${RANKSTREAM_AIRFLOW_HOME:-$(rs_state_dir airflow)}
export AIRFLOW__CORE__DAGS_FOLDER=$_repo/dags
export AIRFLOW__CORE__LOAD_EXAMPLES=False
export AIRFLOW__CORE__EXECUTOR=LocalExecutor
export AIRFLOW__API__HOST=127.0.0.1
export AIRFLOW__API__PORT=${RANKSTREAM_AIRFLOW_PORT:-8080}
export AIRFLOW__API__BASE_URL=http://127.0.0.1:$AIRFLOW__API__PORT
export AIRFLOW__CORE__EXECUTION_API_SERVER_URL=http://127.0.0.1:$AIRFLOW__API__PORT/execution/
export PATH=$_repo/.venv/bin:$PATH
mkdir -p "$AIRFLOW_HOME" && chmod 700 "$AIRFLOW_HOME"
unset _repo
