-- The start attempt that confirmed the running dispatch (issue 30, SPEC §4: a dispatch starts
-- at most once). The executor sends a random start_id with POST /v1/jobs/{id}/start; its SHA-256
-- is kept here while the job runs, so a retry of that same attempt (its answer was lost) gets 200
-- again, and a second attempt with the same nonce (the dispatch replayed to another or a
-- restarted executor) gets 409 nonce_used. NULL: never started, or started without a start_id,
-- which no later confirmation can then repeat.
--
-- A nullable column added last is an instant change in MariaDB 10.3+ and MySQL 8.0: no table
-- copy, no lock beyond a moment's metadata lock.
ALTER TABLE jobs ADD COLUMN start_sha256 BINARY(32) NULL;
