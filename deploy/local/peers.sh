#!/usr/bin/env bash
# Installs (from Debian packages) and starts on loopback what the peer queues of `make bench`
# need, for benchmarks only: PostgreSQL on 127.0.0.1:5432 (River) and Redis on 127.0.0.1:6379
# (Asynq, no persistence). sluice itself needs neither; setup.sh starts what it does need.
# Idempotent: running it again changes nothing that works.
set -euo pipefail

NAME=peers
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"

# --- PostgreSQL --------------------------------------------------------------------------------
if ! port_open 5432; then
  command -v pg_ctlcluster >/dev/null || install postgresql
  ver=$(ls /etc/postgresql | sort -n | tail -1)
  [ -n "$ver" ] || { echo "peers: no PostgreSQL cluster under /etc/postgresql" >&2; exit 1; }
  say "starting PostgreSQL $ver"
  $SUDO pg_ctlcluster "$ver" main start
  wait_for PostgreSQL 5432 60
fi
say "PostgreSQL ready on 127.0.0.1:5432"

# --- Redis -------------------------------------------------------------------------------------
if ! port_open 6379; then
  command -v redis-server >/dev/null || install redis-server
  say "starting Redis"
  $SUDO redis-server --bind 127.0.0.1 --port 6379 --daemonize yes --save '' --appendonly no \
    --pidfile /run/sluice-peers-redis.pid --logfile /var/log/sluice-peers-redis.log
  wait_for Redis 6379 30
fi
say "Redis ready on 127.0.0.1:6379"
