#!/usr/bin/env bash
# Installs (from Debian packages) and starts on loopback whatever sluice needs locally and is
# missing or stopped: MariaDB on 127.0.0.1:3306 (root, empty password), nats-server with
# JetStream on 127.0.0.1:4222, memcached on 127.0.0.1:11211. Creates the `sluice` database and
# waits until every service answers. Also installs chromium, the headless browser the console's
# tests drive (integration/console_test.go). Idempotent: running it again changes nothing that
# works.
# Both `make run` and `make test` (and so CI) call it.
set -euo pipefail

NAME=setup
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"

# Each service is started with a pidfile of its own: start-stop-daemon matching on the
# executable alone would take any other mariadbd (a private server on another port, say) for
# ours and start nothing.

# --- MariaDB ---------------------------------------------------------------------------------
if ! port_open 3306; then
  command -v mariadbd >/dev/null || [ -x /usr/sbin/mariadbd ] || install mariadb-server mariadb-client
  say "starting MariaDB"
  $SUDO mkdir -p /run/mysqld
  $SUDO chown mysql:mysql /run/mysqld 2>/dev/null || true
  $SUDO start-stop-daemon --start --oknodo --background --make-pidfile --pidfile /run/mysqld/sluice-setup.pid --exec /usr/sbin/mariadbd -- --user=mysql --bind-address=127.0.0.1
  wait_for MariaDB 3306 60
fi
mysql_ok() { mysql --protocol=tcp -h127.0.0.1 -uroot -e 'SELECT 1' >/dev/null 2>&1; }
for ((i = 0; i < 100; i++)); do mysql_ok && break; sleep 0.1; done
if ! mysql_ok; then
  # A fresh Debian install lets root in only through the unix socket: allow the empty password
  # over TCP on this development machine, as sluice's default DSN expects.
  say "allowing root with an empty password over TCP"
  $SUDO mysql -uroot -e "ALTER USER 'root'@'localhost' IDENTIFIED VIA mysql_native_password USING PASSWORD('') OR unix_socket; FLUSH PRIVILEGES;"
fi
mysql --protocol=tcp -h127.0.0.1 -uroot -e 'CREATE DATABASE IF NOT EXISTS sluice CHARACTER SET utf8mb4 COLLATE utf8mb4_bin'
say "MariaDB ready on 127.0.0.1:3306 (database sluice)"

# --- NATS with JetStream ---------------------------------------------------------------------
if ! port_open 4222; then
  [ -x /usr/sbin/nats-server ] || command -v nats-server >/dev/null || install nats-server
  bin=$(command -v nats-server || echo /usr/sbin/nats-server)
  say "starting nats-server with JetStream"
  $SUDO mkdir -p /var/lib/nats-server
  $SUDO start-stop-daemon --start --oknodo --background --make-pidfile --pidfile /run/sluice-setup-nats.pid --exec "$bin" -- \
    -a 127.0.0.1 -p 4222 -js -sd /var/lib/nats-server -l /var/log/nats-server.log
  wait_for nats-server 4222 30
fi
say "NATS ready on 127.0.0.1:4222"

# --- memcached -------------------------------------------------------------------------------
if ! port_open 11211; then
  [ -x /usr/bin/memcached ] || install memcached
  say "starting memcached"
  $SUDO start-stop-daemon --start --oknodo --background --make-pidfile --pidfile /run/sluice-setup-memcached.pid --exec /usr/bin/memcached -- \
    -u memcache -l 127.0.0.1 -p 11211 -m 64
  wait_for memcached 11211 30
fi
say "memcached ready on 127.0.0.1:11211"

# --- chromium (the console's browser tests) ---------------------------------------------------
command -v chromium >/dev/null || install chromium
say "chromium ready for the console's browser tests"
