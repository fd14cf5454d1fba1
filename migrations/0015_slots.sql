-- Slots (SPEC §5a): leases on capacity for work the caller runs itself. A slot counts against the
-- same limits as the jobs in flight while expires_at (the database's clock) is in the future;
-- the claim and a slot's grant count both under the claim lock. A release deletes the row; an
-- expired row no longer counts and is deleted by a drainer's upkeep.
--
-- tenant has the type of jobs.tenant but no foreign key to tenants: a slot is never queued, so
-- it needs no queue state, and a grant does not wait for an admission holding its tenant's row.
CREATE TABLE slots (
  id            BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
  tenant        VARBINARY(191) NOT NULL,
  -- The token name that took it: only it (or an admin) may renew or release it.
  caller        VARBINARY(191) NOT NULL,
  -- The lanes it counts toward, sorted and comma-separated ('' for none), so that the live
  -- count groups equal sets together.
  lanes         VARBINARY(1024) NOT NULL DEFAULT '',
  interactive   BOOLEAN NOT NULL DEFAULT FALSE,
  -- Its own lease: a renewal extends it by this much, whatever the config says later.
  lease_seconds INT UNSIGNED NOT NULL,
  expires_at    DATETIME(6) NOT NULL,
  created_at    DATETIME(6) NOT NULL,
  PRIMARY KEY (id),
  -- Counting the live slots (expires_at > NOW(6), covering: no row is read) and the expiry sweep
  -- (expires_at <= NOW(6), oldest first): both one range of this index.
  KEY live (expires_at, tenant, interactive, lanes),
  -- GET /v1/slots?tenant=, newest first.
  KEY tenant (tenant, id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
