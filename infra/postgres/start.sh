#!/usr/bin/env bash
# Start a private PostgreSQL 15 cluster (Debian's postgresql package) for Airflow's metadata DB
# and the Celery result backend: listening on 127.0.0.1 only, its unix socket in the state dir
# (not /var/run/postgresql), a database `airflow` owned by a role `airflow` whose password is
# generated once and kept in the state dir (password, mode 0600). The cluster's superuser (the
# user running this, or `postgres` when run as root) logs in over the socket only (peer auth).
# Idempotent: if this port's cluster runs, it says so and exits 0. Waits until it accepts
# connections. Its data survives a restart; `start.sh --fresh` wipes it first.
#
#   RANKSTREAM_PG_PORT   port (default 5433)
#   RANKSTREAM_PG_DIR    state dir (default ~/.local/state/rankstream/postgres-$PORT): data/,
#                        password, postgres.pid ("pid starttime"), postgres.log, the socket
# PostgreSQL refuses to run as root; as root, initdb and the server run in a user namespace
# (unshare --user) as the `postgres` user, which owns the files only inside it: on disk they
# stay root's, in root's private state dir.
set -euo pipefail
umask 077   # the data, the password and the logs are not world-readable
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../state.sh"
. "$here/cluster.sh"
fresh=$(rs_fresh "$@")
port=${RANKSTREAM_PG_PORT:-5433}
dir=${RANKSTREAM_PG_DIR:-$(rs_state_dir "postgres-$port")}
pidfile=$dir/postgres.pid
pg_bin=$(rs_pg_bin) || exit 1
ready() { "$pg_bin/pg_isready" -q -h 127.0.0.1 -p "$port" -t 1; }

if rs_pg_ours "$pidfile" && ready; then
  echo "postgres already running: pid $(cut -d' ' -f1 "$pidfile"), 127.0.0.1:$port"
  exit 0
fi
if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
  echo "port 127.0.0.1:$port is taken; set RANKSTREAM_PG_PORT" >&2
  exit 1
fi
if [[ ${#dir} -gt 90 ]]; then   # the socket path (dir/.s.PGSQL.PORT) must fit in 107 bytes
  echo "state dir $dir is too long for a unix socket path; set RANKSTREAM_PG_DIR" >&2
  exit 1
fi
if [[ $fresh == 1 ]]; then rm -rf "$dir"; fi
(umask 077 && mkdir -p "$dir")
chmod 700 "$dir"
if [[ ! -s $dir/password ]]; then
  (umask 077 && head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$dir/password")
fi
superuser=$(rs_pg_superuser)
if [[ ! -f $dir/data/PG_VERSION ]]; then
  rm -rf "$dir/data"
  rs_pg_as_owner "$pg_bin/initdb" -D "$dir/data" -U "$superuser" -E UTF8 --locale=C.UTF-8 \
    --auth-local=peer --auth-host=scram-sha-256 > "$dir/initdb.log" 2>&1 \
    || { echo "initdb failed; see $dir/initdb.log" >&2; exit 1; }
  cat >> "$dir/data/postgresql.conf" <<CONF

# rankstream (infra/postgres/start.sh): loopback and a private socket only
listen_addresses = '127.0.0.1'
port = $port
unix_socket_directories = '$dir'
unix_socket_permissions = 0700
password_encryption = scram-sha-256
max_connections = 200
synchronous_commit = off          # a crash may lose the last few commits, never corrupts
CONF
  # only the superuser over the socket, and the airflow role to its database over TCP
  printf '%s\n' "local all $superuser peer" \
    "host airflow airflow 127.0.0.1/32 scram-sha-256" > "$dir/data/pg_hba.conf"
fi
rs_pg_as_owner "$pg_bin/pg_ctl" -D "$dir/data" -l "$dir/postgres.log" -w -t 60 start >/dev/null \
  || { echo "postgres did not start; last lines of $dir/postgres.log:" >&2
       tail -n 20 "$dir/postgres.log" >&2; exit 1; }
pid=$(head -n 1 "$dir/data/postmaster.pid")
# the pid and its start time (field 22 of /proc/PID/stat): stop.sh signals only that process
echo "$pid $(sed 's/.*) //' "/proc/$pid/stat" | cut -d' ' -f20)" > "$pidfile"
# the airflow role and database (once); the password goes in on stdin, never on a command line
psql() { "$pg_bin/psql" -X -q -v ON_ERROR_STOP=1 -h "$dir" -p "$port" -U "$superuser" "$@"; }
if [[ -z $(psql -d postgres -tAc "SELECT 1 FROM pg_roles WHERE rolname = 'airflow'") ]]; then
  psql -d postgres -v pw="$(cat "$dir/password")" <<'SQL'
CREATE ROLE airflow LOGIN PASSWORD :'pw';
SQL
fi
if [[ -z $(psql -d postgres -tAc "SELECT 1 FROM pg_database WHERE datname = 'airflow'") ]]; then
  psql -d postgres -c "CREATE DATABASE airflow OWNER airflow"
fi
echo "postgres started: pid $pid, 127.0.0.1:$port, database airflow (password in $dir/password)"
