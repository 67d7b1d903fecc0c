# Source this file: what infra/postgres/start.sh and stop.sh share.
#   rs_pg_bin            prints the directory of Debian's PostgreSQL 15 programs
#   rs_pg_superuser      the cluster's superuser: the caller, or `postgres` when root
#   rs_pg_as_owner CMD   runs CMD as the cluster's owner: as is, or when root in a user
#                        namespace where root is the `postgres` user (PostgreSQL refuses root)
#   rs_pg_ours PIDFILE   true when PIDFILE's "pid starttime" is a live process we started
rs_pg_bin() {
  local bin=/usr/lib/postgresql/15/bin
  if [[ ! -x $bin/pg_ctl ]] && command -v pg_ctl >/dev/null; then
    bin=$(dirname "$(readlink -f "$(command -v pg_ctl)")")
  fi
  if [[ ! -x $bin/pg_ctl ]]; then
    echo "PostgreSQL 15 is not installed; run: sudo apt-get install postgresql" >&2
    return 1
  fi
  printf '%s\n' "$bin"
}
rs_pg_superuser() {
  if [[ $(id -u) -eq 0 ]]; then echo postgres; else id -un; fi
}
rs_pg_as_owner() {
  if [[ $(id -u) -ne 0 ]]; then "$@"; return; fi
  local uid gid
  uid=$(id -u postgres 2>/dev/null) && gid=$(id -g postgres) || {
    echo "running as root, but there is no postgres user to run PostgreSQL as" >&2; return 1; }
  if ! unshare --user --map-user="$uid" --map-group="$gid" -- true 2>/dev/null; then
    echo "PostgreSQL refuses to run as root, and this kernel does not let root run it in a" \
      "user namespace (unshare --user): run infra/postgres/start.sh as an ordinary user" >&2
    return 1
  fi
  unshare --user --map-user="$uid" --map-group="$gid" -- "$@"
}
rs_pg_ours() {
  local pid started now
  [[ -f $1 ]] || return 1
  read -r pid started < "$1" || return 1
  [[ $pid =~ ^[0-9]+$ && -n ${started:-} ]] || return 1
  now=$(sed 's/.*) //' "/proc/$pid/stat" 2>/dev/null | cut -d' ' -f20) || return 1
  [[ $now == "$started" ]]
}
