-- audit_events keeps two secondary indexes of the four 0013 gave it: every audited admission
-- writes one row, and each index is a B-tree insert of its own. The retention purge walks the
-- primary key instead of `at` (ids are assigned in time order, near enough: see
-- store.PurgeAudit), and GET /v1/audit?event= without a tenant reads newest first by the
-- primary key, a bounded number of rows per request (store.ListAudit).
ALTER TABLE audit_events DROP INDEX event, DROP INDEX at;
