# Shared by setup.sh and peers.sh, which source it after setting NAME (the word their lines
# start with): root or sudo, apt-get install with one update first, and waiting for a loopback
# port. Not a script of its own.

SUDO=""
if [ "$(id -u)" != 0 ]; then
  command -v sudo >/dev/null || { echo "$NAME: need root or sudo to install services" >&2; exit 1; }
  SUDO="sudo"
fi

say() { echo "$NAME: $*"; }

updated=""
install() {
  if [ -z "$updated" ]; then
    say "apt-get update"
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    updated=1
  fi
  say "installing $*"
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

wait_for() { # name port seconds
  local i
  for ((i = 0; i < $3 * 10; i++)); do
    port_open "$2" && return 0
    sleep 0.1
  done
  echo "$NAME: $1 did not answer on 127.0.0.1:$2 within $3 s" >&2
  return 1
}
