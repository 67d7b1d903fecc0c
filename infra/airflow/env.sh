# Source this file: a private Airflow 3 home with a SQLite metadata DB and rankstream's DAGs.
#   . infra/airflow/env.sh     (then: airflow db migrate; airflow dags test rankstream_altsvm)
#   RANKSTREAM_AIRFLOW_HOME    default ${TMPDIR:-/tmp}/rankstream-airflow
_repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
export AIRFLOW_HOME=${RANKSTREAM_AIRFLOW_HOME:-${TMPDIR:-/tmp}/rankstream-airflow}
export AIRFLOW__CORE__DAGS_FOLDER=$_repo/dags
export AIRFLOW__CORE__LOAD_EXAMPLES=False
export AIRFLOW__CORE__EXECUTOR=LocalExecutor
export AIRFLOW__API__HOST=127.0.0.1
export AIRFLOW__API__PORT=${RANKSTREAM_AIRFLOW_PORT:-8080}
export AIRFLOW__API__BASE_URL=http://127.0.0.1:$AIRFLOW__API__PORT
export AIRFLOW__CORE__EXECUTION_API_SERVER_URL=http://127.0.0.1:$AIRFLOW__API__PORT/execution/
export PATH=$_repo/.venv/bin:$PATH
mkdir -p "$AIRFLOW_HOME"
unset _repo
