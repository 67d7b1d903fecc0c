#!/usr/bin/env bash
# Stop the PostgreSQL cluster that start.sh started for this port: a fast shutdown (sessions
# are ended, the data is kept), but only if postgres.pid's "pid starttime" is still that
# process; a stale pid file is removed and its pid left alone. Idempotent.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../state.sh"
. "$here/cluster.sh"
port=${RANKSTREAM_PG_PORT:-5433}
dir=${RANKSTREAM_PG_DIR:-$(rs_state_dir "postgres-$port")}
pidfile=$dir/postgres.pid
if [[ ! -f $pidfile ]]; then echo "postgres: not running (no $pidfile)"; exit 0; fi
if ! rs_pg_ours "$pidfile"; then
  echo "postgres: pid $(cut -d' ' -f1 "$pidfile") is gone or another program; not touching it"
  rm -f "$pidfile"
  exit 0
fi
pid=$(cut -d' ' -f1 "$pidfile")
if ! rs_pg_as_owner "$(rs_pg_bin)/pg_ctl" -D "$dir/data" -m fast -w -t 60 stop >/dev/null; then
  # pg_ctl could not (its postmaster.pid gone?): SIGTERM, then SIGKILL, by our checked pid
  "$here/../stop_pid.sh" postgres "$pidfile" 30 "postgres"
  exit 0
fi
rm -f "$pidfile"
echo "postgres: stopped (pid $pid)"
