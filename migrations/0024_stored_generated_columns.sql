-- The four indexed generated columns become PERSISTENT (stored): jobs.queued_rate_key (0008),
-- jobs.settled_status (0009), jobs.interactive_tenant (0014) and tenants.work_tenant (0010),
-- same names, expressions, positions and indexes (issue 32).
--
-- Why: to remove an index entry of a VIRTUAL column, InnoDB's purge must compute the column's
-- old value, and for that it opens the table's TABLE object (open_purge_table), which for jobs
-- also parses its triggers; that memory sits on the purge workers outside MariaDB's own
-- accounting. On a Galera cluster under three claiming drainers a node grew by 1.4-2.7 GB within
-- 30 s in 4 of 8 runs of deploy/galera/memory-repro.sh, 1.46 GB of a 1.48 GB heap peak from that
-- one path (heaptrack); with the columns stored, 0 of 8 runs grew (deploy/RUNBOOK.md, "The
-- database on a Galera cluster"). A stored value is read from the row like any column.
--
-- It also ends the dance of 0014, 0021 and 0022: MariaDB adds a column instantly only to a table
-- without indexes on virtual columns, so each of them dropped and rebuilt these indexes. After
-- this migration jobs has none, and a later ADD COLUMN is instant.
--
-- The cost is this migration: MariaDB cannot make a virtual column stored in place (MODIFY
-- answers "This is not yet supported for generated columns"), so each column is dropped and
-- added again, which copies the table. One statement per table, so that the indexes never go
-- missing (statements that name them with FORCE INDEX keep working before and after) and the
-- table is copied once. LOCK=SHARED: reads go on, every write to the table waits for the copy
-- (deploy/RUNBOOK.md, "Upgrades: what each migration locks").
ALTER TABLE jobs
  DROP KEY queued_rate_key, DROP KEY settled_id, DROP KEY tenant_settled_id, DROP KEY interactive_queue,
  DROP COLUMN queued_rate_key, DROP COLUMN settled_status, DROP COLUMN interactive_tenant,
  ADD COLUMN queued_rate_key CHAR(64) CHARACTER SET ascii COLLATE ascii_bin
    AS (IF(status = 'queued', RTRIM(rate_key_sha256), NULL)) PERSISTENT AFTER retry_of,
  ADD COLUMN settled_status VARCHAR(10) CHARACTER SET ascii COLLATE ascii_bin
    AS (IF(status IN ('queued','claimed','dispatched','running'), NULL, status)) PERSISTENT AFTER queued_rate_key,
  ADD COLUMN interactive_tenant VARBINARY(191)
    AS (IF(interactive AND status = 'queued', tenant, NULL)) PERSISTENT AFTER interactive,
  ADD KEY queued_rate_key (queued_rate_key), ADD KEY settled_id (settled_status, id),
  ADD KEY tenant_settled_id (tenant, settled_status, id), ADD KEY interactive_queue (interactive_tenant, queued_at, id),
  ALGORITHM=COPY, LOCK=SHARED;
ALTER TABLE tenants
  DROP KEY work_tenant, DROP COLUMN work_tenant,
  ADD COLUMN work_tenant VARBINARY(191) AS (IF(head_id IS NULL, NULL, tenant)) PERSISTENT AFTER head_id,
  ADD KEY work_tenant (work_tenant),
  ALGORITHM=COPY, LOCK=SHARED;
