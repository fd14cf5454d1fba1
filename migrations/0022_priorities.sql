-- Priorities inside a tenant's queue (SPEC §5, issue "weighted fairness"): a job's priority 0-9
-- (default 5) orders its tenant's queued jobs after the interactive ones, higher first, then by
-- age; a job queued longer than priority_aging_seconds is served as if at the top.
--
-- The column is plain: the claim index and the tenants' head stay in queue order (age), which is
-- what fair and fifo compare between tenants. A pass finds a tenant's jobs of another priority
-- than the default through job_priorities, a small table written only for them at admission
-- (tenant, priority highest first, age), and merges them with the tenant's heads read by age
-- (store.ReadHeads). As in 0021, no index on jobs: jobs that never set a priority cost nothing, and
-- the rows whose jobs have ended are deleted by the drainers' upkeep, not by the outcome's
-- transaction.
--
-- As in 0014 and 0021: MariaDB adds a column instantly only to a table without indexes on virtual
-- columns, so those indexes are dropped (in place, no lock), the column added instantly, and the
-- indexes built again in one online pass (LOCK=NONE).
ALTER TABLE jobs DROP KEY queued_rate_key, DROP KEY settled_id, DROP KEY tenant_settled_id, DROP KEY interactive_queue,
  ALGORITHM=INPLACE, LOCK=NONE;
ALTER TABLE jobs ADD COLUMN priority TINYINT UNSIGNED NOT NULL DEFAULT 5, ALGORITHM=INSTANT;
ALTER TABLE jobs ADD KEY queued_rate_key (queued_rate_key), ADD KEY settled_id (settled_status, id),
  ADD KEY tenant_settled_id (tenant, settled_status, id), ADD KEY interactive_queue (interactive_tenant, queued_at, id),
  ALGORITHM=INPLACE, LOCK=NONE;

CREATE TABLE job_priorities (
  job_id    BIGINT UNSIGNED NOT NULL PRIMARY KEY,
  tenant    VARBINARY(191) NOT NULL,
  priority  TINYINT UNSIGNED NOT NULL,
  queued_at DATETIME(6) NOT NULL,
  KEY tenant_order (tenant, priority DESC, queued_at, job_id)
) ENGINE=InnoDB;
