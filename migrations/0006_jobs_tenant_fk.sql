-- The drainer finds the tenants with queued work by probing the claim index once per row of
-- tenants, so every job's tenant must have a row there. The foreign key makes a path that forgets
-- it fail loudly instead of leaving its jobs unclaimed.
INSERT IGNORE INTO tenants (tenant, created_at) SELECT DISTINCT tenant, UTC_TIMESTAMP(6) FROM jobs;
ALTER TABLE jobs ADD CONSTRAINT jobs_tenant_fk FOREIGN KEY (tenant) REFERENCES tenants (tenant);
