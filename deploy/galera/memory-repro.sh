#!/usr/bin/env bash
# The reproduction of the Galera nodes' memory growth that migration 0024 fixed (deploy/RUNBOOK.md,
# "The nodes' memory"), kept to show that it stays fixed, in about two minutes: a fresh cluster,
# gate/store's tests against it, then TestThreeDrainerProcesses, with each node's resident memory
# sampled every second. Prints each node's peak and exits 1 if one grew by more than a gigabyte
# over its size before the drain (before 0024: in 4 of 8 runs).
#
#   deploy/galera/memory-repro.sh [-count N]    (N: how many times gate/store's tests run; 2)
#
# It needs what deploy/galera/cluster.sh needs, and Go; it works from the repository's root. The cluster
# is deleted at the end.
set -euo pipefail
cd "$(dirname "$0")/../.."
count=2
[ "${1:-}" = "-count" ] && count=${2:?-count needs a number}
cluster=deploy/galera/cluster.sh
samples=$(mktemp)
trap 'kill "${sampler:-}" 2>/dev/null || true; bash "$cluster" down >/dev/null 2>&1 || true; rm -f "$samples"' EXIT

rss() { # node: its mariadbd's VmRSS in MiB, or 0
  local pid
  pid=$(pgrep -f -- "node$1/my.cnf( |$)" | head -1 || true)
  [ -n "$pid" ] && awk '/VmRSS/ {print int($2 / 1024)}' "/proc/$pid/status" 2>/dev/null || echo 0
}

bash "$cluster" down >/dev/null 2>&1 || true
bash "$cluster" up
export SLUICE_TEST_MYSQL_DSN='root@tcp(127.0.0.1:3310)/' SLUICE_TEST_GALERA=1
echo "memory-repro: gate/store's tests against the cluster ($count time(s))"
go test -count="$count" -p 1 -timeout 20m ./gate/store
declare -A before
for n in 1 2 3; do before[$n]=$(rss "$n"); done
echo "memory-repro: before the drain: node1 ${before[1]} MiB, node2 ${before[2]} MiB, node3 ${before[3]} MiB"
(while true; do echo "$(rss 1) $(rss 2) $(rss 3)"; sleep 1; done) >"$samples" &
sampler=$!
go test -count=1 -p 1 -timeout 20m -run 'ThreeDrainerProcesses' ./integration/
kill "$sampler"
status=0
for n in 1 2 3; do
  peak=$(awk -v c="$n" 'BEGIN {m = 0} $c + 0 > m {m = $c + 0} END {print m}' "$samples")
  echo "memory-repro: node$n peak ${peak} MiB during the drain (before: ${before[$n]} MiB)"
  if [ $((peak - before[$n])) -gt 1024 ]; then status=1; fi
done
[ "$status" = 0 ] && echo "memory-repro: no node grew by more than 1 GiB" || echo "memory-repro: a node grew by more than 1 GiB"
exit "$status"
