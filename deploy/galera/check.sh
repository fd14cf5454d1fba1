#!/bin/sh
# HAProxy's external health check of one Galera node (cluster.sh's proxy): healthy only when the
# node is Synced (wsrep_local_state 4) and ready for queries. A node that is joining, donating,
# or cut off from the primary component still accepts connections, so a TCP or mysql-check
# would send sluice's writes to a node that refuses or, worse, lags.
# HAProxy calls it with: <proxy address> <proxy port> <server address> <server port>.
state=$(mysql --protocol=tcp -h"$3" -P"$4" -uroot -N -B --connect-timeout=1 \
  -e "SELECT MAX(IF(VARIABLE_NAME = 'WSREP_LOCAL_STATE', VARIABLE_VALUE, NULL)),
             MAX(IF(VARIABLE_NAME = 'WSREP_READY', VARIABLE_VALUE, NULL))
      FROM information_schema.GLOBAL_STATUS
      WHERE VARIABLE_NAME IN ('WSREP_LOCAL_STATE', 'WSREP_READY')" 2>/dev/null) || exit 1
[ "$state" = "4	ON" ]
