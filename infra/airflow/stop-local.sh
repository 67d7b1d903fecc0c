#!/usr/bin/env bash
# Stop what start-local.sh started, by process id.
set -euo pipefail
. "$(dirname "$0")/env.sh"
for name in dag-processor scheduler api-server; do
  "$(dirname "$0")/../stop_pid.sh" "$name" "$AIRFLOW_HOME/run/$name.pid" 20 "airflow $name"
done
