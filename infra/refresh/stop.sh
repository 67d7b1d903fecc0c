#!/usr/bin/env bash
# Stop the `rankstream refresh` that start.sh started for these models (same arguments), by its
# process id, only after checking /proc that the pid is still that process; idempotent. SIGTERM
# first: it writes and commits what it applied and leaves its consumer groups (the partitions
# go to another refresher of the same models at once); SIGKILL after 30 s.
#
#   infra/refresh/stop.sh [MODEL ...]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../state.sh"
name=all
if (($#)); then name=$(IFS=+; echo "$*"); fi
dir=${RANKSTREAM_REFRESH_DIR:-$(rs_state_dir "refresh-$name")}
exec "$here/../stop_pid.sh" refresh "$dir/refresh.pid" 30 "(rankstream|pipeline\.cli) refresh"
