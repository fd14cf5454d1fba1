-- A job's lanes and whether it is interactive (SPEC §5a, issue 18). The claim counts a job in
-- flight against each lane it names, and keeps the interactive reserve for interactive jobs;
-- within a tenant, interactive queued jobs go before its other queued jobs.
--
-- lanes is the job's lane names, sorted and comma-joined ('' for none): at most 8 names of at
-- most 64 bytes of [A-Za-z0-9._-] (limits.validName), so ASCII and at most 519 bytes, stored
-- inline; a job without lanes costs one length byte. The claim reads it only for jobs in flight
-- (bounded by the global cap) and for the heads it read, never through an index, so it stays out
-- of every index. Both columns are added at the end with defaults.
--
-- MariaDB adds a column instantly only to a table without indexes on virtual columns, and jobs
-- has three (migrations 0008, 0009); with them it rebuilds the table and, since it cannot do that
-- online, blocks every write to jobs: 21 s per million jobs (integration/migration_locks_bench_test.go;
-- deploy/RUNBOOK.md, "Upgrades: what each migration locks"). So those indexes are dropped (in
-- place, no lock), the columns added instantly, and the indexes built again, with this
-- migration's own, in one online pass (LOCK=NONE) while jobs are written. Until it ends, the
-- listings of finished jobs by state and the queued jobs per rate key (GET /v1/gates, the status's
-- gates) read the table without their index: slower, bounded by the API's statement time limit.
ALTER TABLE jobs DROP KEY queued_rate_key, DROP KEY settled_id, DROP KEY tenant_settled_id, ALGORITHM=INPLACE, LOCK=NONE;
ALTER TABLE jobs
  ADD COLUMN lanes VARCHAR(520) CHARACTER SET ascii COLLATE ascii_bin NOT NULL DEFAULT '',
  ADD COLUMN interactive BOOLEAN NOT NULL DEFAULT FALSE, ALGORITHM=INSTANT;

-- Interactive queued jobs go first within their tenant. The claim index (status, tenant,
-- queued_at, id) and the tenants' head (migration 0010) stay in queue order, which is what fair
-- and fifo compare between tenants and what a queued job's position counts; a pass finds a
-- tenant's interactive queued jobs through this index instead: the tenant's name while the job
-- is interactive and queued, NULL otherwise. Plain jobs (NULL) never move in it, so a claim or an
-- outcome of a plain job does not touch it; a pass asks it whether a tenant of its page has any
-- (one index dive per tenant read) and reads a flagged tenant's interactive jobs in queue order,
-- bounded like its other heads.
ALTER TABLE jobs
  ADD COLUMN interactive_tenant VARBINARY(191) AS (IF(interactive AND status = 'queued', tenant, NULL)) VIRTUAL, ALGORITHM=INSTANT;

ALTER TABLE jobs ADD KEY queued_rate_key (queued_rate_key), ADD KEY settled_id (settled_status, id),
  ADD KEY tenant_settled_id (tenant, settled_status, id), ADD KEY interactive_queue (interactive_tenant, queued_at, id),
  ALGORITHM=INPLACE, LOCK=NONE;
