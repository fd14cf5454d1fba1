#!/usr/bin/env bash
# A 3-node MariaDB Galera cluster on loopback for development and tests, behind HAProxy with one
# writer at a time: what sluice's SPEC §3 calls a cluster "reached through a health-checked proxy".
# Installs what is missing from Debian packages (mariadb-server, galera-4, rsync, haproxy), like
# deploy/local/setup.sh. Node data lives under $SLUICE_GALERA_DIR (default /tmp/sluice-galera).
#
#   cluster.sh up          bootstrap node 1, join nodes 2 and 3, start the proxy (idempotent)
#   cluster.sh status      each node's state, size and auto_increment_increment, and the writer
#   cluster.sh stop N      shut node N down cleanly
#   cluster.sh kill N      SIGKILL node N (its machine died)
#   cluster.sh start N     start node N again: it rejoins (IST, or SST by rsync)
#   cluster.sh down        stop everything and delete the data
#
# Ports: sluice connects to the proxy, 127.0.0.1:3310 (root, empty password, as the local
# server). Node N serves SQL on 331N, Galera replication on 456N, IST on 457N, SST on 458N.
# The proxy sends every connection to node 1 while it is healthy, else to node 2, else node 3
# (HAProxy backups); when a node earlier in that order is healthy again, the connections to the
# later one are cut and sluice reconnects to it: one writer at a time. Health is
# deploy/galera/check.sh, which asks the node for wsrep_local_state = 4 (Synced) and
# wsrep_ready = ON, every second; two failures take a node out, and its connections are cut so
# that sluice reconnects to the next one.
set -euo pipefail

NAME=galera
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=../local/lib.sh
source "$here/../local/lib.sh"

dir=${SLUICE_GALERA_DIR:-/tmp/sluice-galera}
proxy_port=3310
nodes=(1 2 3)

sql_port() { echo $((3310 + $1)); }
node_dir() { echo "$dir/node$1"; }
pidfile() { echo "$(node_dir "$1")/mariadbd.pid"; }
sock() { echo "$(node_dir "$1")/mysqld.sock"; }

ensure_packages() {
  [ -x /usr/sbin/mariadbd ] || install mariadb-server mariadb-client
  [ -e /usr/lib/galera/libgalera_smm.so ] || install galera-4
  command -v rsync >/dev/null || install rsync
  command -v haproxy >/dev/null || [ -x /usr/sbin/haproxy ] || install haproxy
}

write_config() { # node
  local n=$1 d donors
  d=$(node_dir "$n")
  # A node that rejoins takes its state from node 3, the proxy's last backup, before any other:
  # a donor leaves the proxy (not Synced), and a donor that was the writer sent the writes to the
  # next backup while the first came back, two nodes writing at once (deploy/RUNBOOK.md).
  donors=node3,
  [ "$n" = 3 ] && donors=node2,
  mkdir -p "$d/data"
  cat >"$d/my.cnf" <<EOF
[mariadbd]
datadir=$d/data
port=$(sql_port "$n")
bind-address=127.0.0.1
socket=$(sock "$n")
pid-file=$(pidfile "$n")
log-error=$d/error.log
user=mysql
skip-name-resolve
innodb_buffer_pool_size=256M
innodb_log_file_size=64M
max_connections=400
# Galera needs row events and interleaved auto-increment locks.
binlog_format=ROW
innodb_autoinc_lock_mode=2
wsrep_on=ON
wsrep_provider=/usr/lib/galera/libgalera_smm.so
wsrep_cluster_name=sluice-dev
wsrep_cluster_address=gcomm://127.0.0.1:4561,127.0.0.1:4562,127.0.0.1:4563
wsrep_node_name=node$n
wsrep_node_address=127.0.0.1:456$n
wsrep_provider_options="gmcast.listen_addr=tcp://127.0.0.1:456$n;ist.recv_addr=127.0.0.1:457$n;gcache.size=128M;evs.suspect_timeout=PT3S;evs.inactive_timeout=PT6S"
wsrep_sst_method=rsync
wsrep_sst_donor=$donors
wsrep_sst_receive_address=127.0.0.1:458$n
EOF
  chown -R mysql:mysql "$d"
}

node_pid() { # node: the pid of its mariadbd, found by its config file (the pid file is
  # written only once the server is up)
  pgrep -f -- "--defaults-file=$(node_dir "$1")/my.cnf( |$)" | head -1
}

running() { [ -n "$(node_pid "$1")" ]; }

wsrep() { # node variable: a status variable of the node, empty if it does not answer
  mysql --protocol=tcp -h127.0.0.1 -P"$(sql_port "$1")" -uroot -N -B \
    -e "SHOW GLOBAL STATUS LIKE '$2'" 2>/dev/null | awk '{print $2}'
}

wait_synced() { # node seconds
  local i
  for ((i = 0; i < $2 * 10; i++)); do
    [ "$(wsrep "$1" wsrep_local_state)" = 4 ] && return 0
    running "$1" || { echo "$NAME: node $1 exited; see $(node_dir "$1")/error.log" >&2; return 1; }
    sleep 0.1
  done
  echo "$NAME: node $1 not synced within $2 s; see $(node_dir "$1")/error.log" >&2
  return 1
}

start_node() { # node [extra mariadbd arguments]
  local n=$1
  shift
  if running "$n"; then
    say "node $n already running"
    return 0
  fi
  write_config "$n"
  say "starting node $n on 127.0.0.1:$(sql_port "$n")"
  $SUDO setsid /usr/sbin/mariadbd --defaults-file="$(node_dir "$n")/my.cnf" "$@" </dev/null >/dev/null 2>&1 &
  wait_synced "$n" 120
  say "node $n synced"
}

bootstrap() {
  local d
  d=$(node_dir 1)
  if [ ! -d "$d/data/mysql" ]; then
    write_config 1
    say "initialising node 1's data directory"
    mariadb-install-db --defaults-file="$d/my.cnf" --auth-root-authentication-method=normal >"$d/install.log" 2>&1
  fi
  # A node may bootstrap only if it was the last to leave (safe_to_bootstrap): after `down`, or
  # after a crash of the whole cluster where node 1 was last, which is what a dev cluster sees.
  [ -f "$d/data/grastate.dat" ] && sed -i 's/^safe_to_bootstrap: 0/safe_to_bootstrap: 1/' "$d/data/grastate.dat"
  start_node 1 --wsrep-new-cluster
  mysql --protocol=socket -S "$(sock 1)" -uroot <<'EOF'
CREATE USER IF NOT EXISTS 'root'@'127.0.0.1' IDENTIFIED BY '';
GRANT ALL ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION;
CREATE DATABASE IF NOT EXISTS sluice CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
EOF
}

proxy_cfg() {
  cat >"$dir/haproxy.cfg" <<EOF
global
  maxconn 2000
  external-check
  insecure-fork-wanted
  pidfile $dir/haproxy.pid

defaults
  mode tcp
  timeout connect 2s
  timeout client 1h
  timeout server 1h
  timeout check 2s

listen sluice-mysql
  bind 127.0.0.1:$proxy_port
  option external-check
  external-check path "/usr/bin:/bin"
  external-check command $here/check.sh
  # A node marked down has its connections cut, so that sluice reconnects to the next node; a
  # node marked up again cuts the backups' connections, so that new and old connections do not
  # write through two nodes at once.
  default-server inter 1s fall 2 rise 2 on-marked-down shutdown-sessions on-marked-up shutdown-backup-sessions
  server node1 127.0.0.1:3311 check
  server node2 127.0.0.1:3312 check backup
  server node3 127.0.0.1:3313 check backup
EOF
}

start_proxy() {
  proxy_cfg
  if [ -f "$dir/haproxy.pid" ] && kill -0 "$(cat "$dir/haproxy.pid")" 2>/dev/null; then
    return 0
  fi
  say "starting HAProxy on 127.0.0.1:$proxy_port"
  haproxy -D -f "$dir/haproxy.cfg"
  wait_for HAProxy "$proxy_port" 10
}

case "${1:-}" in
up)
  ensure_packages
  mkdir -p "$dir"
  if running 1 || running 2 || running 3; then
    for n in "${nodes[@]}"; do running "$n" || start_node "$n"; done
  else
    bootstrap
    start_node 2
    start_node 3
  fi
  start_proxy
  say "cluster of $(wsrep 1 wsrep_cluster_size) ready; sluice's DSN: root@tcp(127.0.0.1:$proxy_port)/sluice"
  ;;
status)
  for n in "${nodes[@]}"; do
    if running "$n"; then
      echo "node $n: $(wsrep "$n" wsrep_local_state_comment), cluster size $(wsrep "$n" wsrep_cluster_size)," \
        "auto_increment_increment $(mysql --protocol=tcp -h127.0.0.1 -P"$(sql_port "$n")" -uroot -N -B -e 'SELECT @@auto_increment_increment' 2>/dev/null)"
    else
      echo "node $n: down"
    fi
  done
  echo "writer through the proxy: $(mysql --protocol=tcp -h127.0.0.1 -P$proxy_port -uroot -N -B -e 'SELECT @@wsrep_node_name' 2>/dev/null || echo none)"
  ;;
stop)
  n=${2:?node}
  say "stopping node $n"
  running "$n" && kill -TERM "$(node_pid "$n")"
  for ((i = 0; i < 600; i++)); do running "$n" || break; sleep 0.1; done
  ;;
kill)
  n=${2:?node}
  say "killing node $n"
  running "$n" && kill -KILL "$(node_pid "$n")"
  for ((i = 0; i < 100; i++)); do running "$n" || break; sleep 0.1; done
  ;;
start)
  start_node "${2:?node}"
  ;;
down)
  [ -f "$dir/haproxy.pid" ] && kill "$(cat "$dir/haproxy.pid")" 2>/dev/null || true
  for n in 3 2 1; do
    if running "$n"; then
      kill -TERM "$(node_pid "$n")"
      for ((i = 0; i < 600; i++)); do running "$n" || break; sleep 0.1; done
    fi
  done
  rm -rf "$dir"
  say "cluster stopped and its data deleted"
  ;;
*)
  sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
  ;;
esac
