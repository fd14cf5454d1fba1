-- Issue "time and waiting" (SPEC §4, §6): start deadlines, and keys that keep only the newest
-- queued job.
--
-- A job admitted with start_by that is not dispatched by then ends expired with error_code
-- start_deadline, and is never dispatched after it; a job admitted with replace_key replaces the
-- queued job of its tenant with the same key, which ends replaced (a new terminal state, added
-- last to the ENUM: an instant change), replaced_by naming its successor. NULL: no deadline, no
-- key, as every job before this migration.
--
-- The lookups these need live in two small tables written only for jobs that use them, not in
-- indexes on jobs: an index on jobs, even on a virtual column that stays NULL, costs every
-- admission an entry and every change of state its evaluation (issue 31 measured 8-12 % of batch
-- admission and of the drain for two such indexes). job_deadlines holds the deadline of each job
-- admitted with one, by time, for the drainer's sweep; a row whose job has left the queue is
-- deleted when the sweep meets it. replace_keys maps a tenant's key to its newest job; the
-- tenant's row lock, which every admission of the tenant takes first, keeps one queued job per
-- key. Its rows go when the purge deletes their jobs.
--
-- As in 0014: MariaDB adds columns instantly only to a table without indexes on virtual columns,
-- and rebuilds jobs otherwise, so those indexes are dropped (in place, no lock), the columns
-- added instantly, and the indexes built again in one online pass (LOCK=NONE). Until it ends,
-- the listings of finished jobs by state, the gates' counts and a tenant's interactive jobs read
-- jobs without their index: slower, bounded by the API's statement time limit.
ALTER TABLE jobs MODIFY status ENUM('queued','claimed','dispatched','running','succeeded','failed','canceled',
  'rejected','lost','expired','replaced') NOT NULL, ALGORITHM=INSTANT;
ALTER TABLE jobs DROP KEY queued_rate_key, DROP KEY settled_id, DROP KEY tenant_settled_id, DROP KEY interactive_queue,
  ALGORITHM=INPLACE, LOCK=NONE;
ALTER TABLE jobs ADD COLUMN start_by DATETIME(6) NULL, ADD COLUMN replace_key VARBINARY(255) NULL,
  ADD COLUMN replaced_by BIGINT UNSIGNED NULL, ALGORITHM=INSTANT;
ALTER TABLE jobs ADD KEY queued_rate_key (queued_rate_key), ADD KEY settled_id (settled_status, id),
  ADD KEY tenant_settled_id (tenant, settled_status, id), ADD KEY interactive_queue (interactive_tenant, queued_at, id),
  ALGORITHM=INPLACE, LOCK=NONE;

CREATE TABLE job_deadlines (
  job_id   BIGINT UNSIGNED NOT NULL PRIMARY KEY,
  start_by DATETIME(6) NOT NULL,
  KEY start_by (start_by, job_id)
) ENGINE=InnoDB;

CREATE TABLE replace_keys (
  tenant      VARBINARY(191) NOT NULL,
  replace_key VARBINARY(255) NOT NULL,
  job_id      BIGINT UNSIGNED NOT NULL,
  PRIMARY KEY (tenant, replace_key),
  KEY job_id (job_id)
) ENGINE=InnoDB;
