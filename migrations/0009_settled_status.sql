-- Listings by state (GET /v1/jobs?status=, with or without tenant) of finished jobs are read from
-- indexes on a generated column that holds the status only once it is final, and is NULL
-- while the job is queued or in flight. The status_id (status, id) and tenant_status_id (tenant,
-- status, id) indexes they replace had status in their keys, so each transition of each job
-- deleted and inserted an entry of both: a drained job paid for four such changes, and now pays
-- for two, at its final transition. Listings of queued and in-flight jobs read the claim index
-- (status, tenant, queued_at, id) instead and sort by id: their rows are bounded by the depth and
-- in-flight caps. Virtual and online, as in 0008 (1,000,000 rows: 2.6 s).
ALTER TABLE jobs ADD COLUMN settled_status VARCHAR(10) CHARACTER SET ascii COLLATE ascii_bin
    AS (IF(status IN ('queued','claimed','dispatched','running'), NULL, status)) VIRTUAL, ALGORITHM=INSTANT;
ALTER TABLE jobs ADD KEY settled_id (settled_status, id), ADD KEY tenant_settled_id (tenant, settled_status, id), ALGORITHM=INPLACE, LOCK=NONE;
ALTER TABLE jobs DROP KEY status_id, DROP KEY tenant_status_id, ALGORITHM=INPLACE, LOCK=NONE;
