-- A job's start deadline (issue "time and waiting", SPEC §4): a job admitted with start_by that is
-- not dispatched by then ends expired with error_code start_deadline, and is never dispatched
-- after it. NULL: no deadline, as every job before this migration.
--
-- The drainer's upkeep finds the queued jobs past their deadline through queued_start_by: the
-- deadline while the job is queued, NULL otherwise. A job without a deadline is NULL there for
-- life, so neither its admission's entry nor any transition of it moves in this index; only the
-- jobs that have a deadline leave it when they leave the queue.
--
-- As in 0014: MariaDB adds columns instantly only to a table without indexes on virtual columns,
-- and rebuilds jobs otherwise, so those indexes are dropped (in place, no lock), the columns
-- added instantly, and every index built again, with this migration's own, in one online pass
-- (LOCK=NONE). Until it ends, the listings of finished jobs by state, the gates' counts and a
-- tenant's interactive jobs read jobs without their index: slower, bounded by the API's
-- statement time limit.
ALTER TABLE jobs DROP KEY queued_rate_key, DROP KEY settled_id, DROP KEY tenant_settled_id, DROP KEY interactive_queue,
  ALGORITHM=INPLACE, LOCK=NONE;
ALTER TABLE jobs ADD COLUMN start_by DATETIME(6) NULL, ALGORITHM=INSTANT;
ALTER TABLE jobs ADD COLUMN queued_start_by DATETIME(6) AS (IF(status = 'queued', start_by, NULL)) VIRTUAL, ALGORITHM=INSTANT;
ALTER TABLE jobs ADD KEY queued_rate_key (queued_rate_key), ADD KEY settled_id (settled_status, id),
  ADD KEY tenant_settled_id (tenant, settled_status, id), ADD KEY interactive_queue (interactive_tenant, queued_at, id),
  ADD KEY queued_start_by (queued_start_by), ALGORITHM=INPLACE, LOCK=NONE;
