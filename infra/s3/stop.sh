#!/usr/bin/env bash
# Stop the S3 server started by start.sh for this port, by its process id; idempotent.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
. "$here/state.sh"
port=${RANKSTREAM_S3_PORT:-8333}
dir=${RANKSTREAM_S3_DIR:-$(rs_state_dir "s3-$port")}
# weed does not finish its own shutdown on SIGTERM (its gRPC servers wait for each other), so
# the grace is short: what it acknowledged is in the kernel's page cache, which a SIGKILL keeps
exec "$here/stop_pid.sh" s3 "$dir/weed.pid" 5 "weed-[^ ]* .*server .*-s3.port=$port "
