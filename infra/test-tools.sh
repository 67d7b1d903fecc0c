#!/usr/bin/env bash
# What only the tests and benches need, from Debian's packages: chromium (the report page is
# checked in a real headless browser), wrk (the HTTP load generator of bench/serve_load.py) and
# postgresql (Airflow's database on Celery workers: infra/postgres, tests/multihost).
# Run as root (CI does); without root it says what to install and exits 0, and the tests that
# need them skip saying why.
set -euo pipefail
need=()
command -v chromium >/dev/null || need+=(chromium fonts-dejavu-core)
command -v wrk >/dev/null || need+=(wrk)
[[ -x /usr/lib/postgresql/15/bin/pg_ctl ]] || need+=(postgresql)
[[ ${#need[@]} -eq 0 ]] && exit 0
if [[ $(id -u) -ne 0 ]]; then
  echo "[test-tools] not root: install ${need[*]} (apt-get) to run every test and bench" >&2
  exit 0
fi
echo "[test-tools] installing ${need[*]} (Debian packages)" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -q "${need[@]}" >/dev/null 2>&1 \
  || { apt-get update -q >/dev/null && apt-get install -y -q "${need[@]}" >/dev/null; }
