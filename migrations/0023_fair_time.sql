-- ordering fair_time (SPEC §5, issue "weighted fairness"): each tenant is charged the executor
-- time its jobs used, from their start to their outcome as recorded, over a sliding window, and
-- the claim serves the tenant furthest below its weighted share.
--
-- tenant_time holds, per tenant charged, its time used in seconds, decayed exponentially with the
-- window (limits.FairTimeWindow) as of used_at. Only outcomes written while ordering is fair_time
-- charge it (the outcome's own transaction: one upsert of the batch's tenants, last in the lock
-- order, after the job rows), so another ordering costs nothing. Its rows go with their tenants
-- when the purge deletes a tenant left with no job.
CREATE TABLE tenant_time (
  tenant  VARBINARY(191) NOT NULL PRIMARY KEY,
  used    DOUBLE NOT NULL,
  used_at DATETIME(6) NOT NULL
) ENGINE=InnoDB;
