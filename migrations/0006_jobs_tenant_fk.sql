-- The drainer finds the tenants with queued work by probing the claim index once per row of
-- tenants, so every job's tenant must have a row there. The foreign key makes a path that forgets
-- it fail loudly instead of leaving its jobs unclaimed.
--
-- Online: with foreign_key_checks on, MariaDB adds a foreign key only by copying the table
-- (ALGORITHM=COPY, LOCK=SHARED), which blocked every write to jobs and tenants for 37 s per
-- million jobs (integration/migration_locks_bench_test.go; deploy/RUNBOOK.md, "Upgrades: what
-- each migration locks"). With the checks off for this one session it is a change of metadata
-- (in place, no lock, 0.1 s), and the rows already there are not checked: the INSERT IGNORE
-- before it gives every job's tenant a row, and the one after it those of the jobs written in
-- between; from the ALTER on, the key checks every write.
INSERT IGNORE INTO tenants (tenant, created_at) SELECT DISTINCT tenant, UTC_TIMESTAMP(6) FROM jobs;
SET SESSION foreign_key_checks = 0;
ALTER TABLE jobs ADD CONSTRAINT jobs_tenant_fk FOREIGN KEY (tenant) REFERENCES tenants (tenant), ALGORITHM=INPLACE, LOCK=NONE;
SET SESSION foreign_key_checks = 1;
INSERT IGNORE INTO tenants (tenant, created_at) SELECT DISTINCT tenant, UTC_TIMESTAMP(6) FROM jobs;
