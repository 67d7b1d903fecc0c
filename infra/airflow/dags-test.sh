#!/usr/bin/env bash
# dags-test.sh DAG_ID [LOGICAL_DATE]: migrate the private SQLite DB (once) and run
# `airflow dags test` in-process: no scheduler, no web server, nothing listening.
set -euo pipefail
. "$(dirname "$0")/env.sh"
[[ -f $AIRFLOW_HOME/.migrated ]] || { airflow db migrate >/dev/null && touch "$AIRFLOW_HOME/.migrated"; }
exec airflow dags test "$@"
