-- Issue "time and waiting" (SPEC §4, §6): start deadlines and keys that keep only the newest
-- queued job.
--
-- A job admitted with start_by that is not dispatched by then ends expired with error_code
-- start_deadline, and is never dispatched after it. NULL: no deadline, as every job before this
-- migration.
--
-- The drainer's upkeep finds the queued jobs past their deadline through queued_start_by: the
-- deadline while the job is queued, NULL otherwise. A job without a deadline is NULL there for
-- life, so neither its admission's entry nor any transition of it moves in this index; only the
-- jobs that have a deadline leave it when they leave the queue.
--
-- A job admitted with replace_key replaces the queued job of its tenant with the same key, if
-- any: that one ends replaced, replaced_by naming its successor. The admission finds it through
-- queued_replace (the key while the job is queued, NULL otherwise: as above, a job without a key
-- never moves in it). The tenant's row lock, which every admission of the tenant takes first,
-- keeps one queued job per key. 'replaced' is a new terminal state, added last to the ENUM (an
-- instant change).
--
-- As in 0014: MariaDB adds columns instantly only to a table without indexes on virtual columns,
-- and rebuilds jobs otherwise, so those indexes are dropped (in place, no lock), the columns
-- added instantly, and every index built again, with this migration's own, in one online pass
-- (LOCK=NONE). Until it ends, the listings of finished jobs by state, the gates' counts and a
-- tenant's interactive jobs read jobs without their index: slower, bounded by the API's
-- statement time limit.
ALTER TABLE jobs DROP KEY queued_rate_key, DROP KEY settled_id, DROP KEY tenant_settled_id, DROP KEY interactive_queue,
  ALGORITHM=INPLACE, LOCK=NONE;
ALTER TABLE jobs MODIFY status ENUM('queued','claimed','dispatched','running','succeeded','failed','canceled',
  'rejected','lost','expired','replaced') NOT NULL, ALGORITHM=INSTANT;
ALTER TABLE jobs ADD COLUMN start_by DATETIME(6) NULL, ADD COLUMN replace_key VARBINARY(255) NULL,
  ADD COLUMN replaced_by BIGINT UNSIGNED NULL, ALGORITHM=INSTANT;
ALTER TABLE jobs ADD COLUMN queued_start_by DATETIME(6) AS (IF(status = 'queued', start_by, NULL)) VIRTUAL,
  ADD COLUMN queued_replace_key VARBINARY(255) AS (IF(status = 'queued', replace_key, NULL)) VIRTUAL, ALGORITHM=INSTANT;
ALTER TABLE jobs ADD KEY queued_rate_key (queued_rate_key), ADD KEY settled_id (settled_status, id),
  ADD KEY tenant_settled_id (tenant, settled_status, id), ADD KEY interactive_queue (interactive_tenant, queued_at, id),
  ADD KEY queued_start_by (queued_start_by), ADD KEY queued_replace (tenant, queued_replace_key), ALGORITHM=INPLACE, LOCK=NONE;
