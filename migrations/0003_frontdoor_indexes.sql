-- Indexes for the front door (issue 4): GET /v1/jobs lists newest first by id, filtered by
-- tenant and status, and redrive looks up the job an earlier redrive created.
-- One tenant's jobs in one state, newest first (GET /v1/jobs?tenant=&status=).
ALTER TABLE jobs ADD KEY tenant_status_id (tenant, status, id);
-- Every tenant's jobs in one state, newest first (an admin's GET /v1/jobs?status=).
ALTER TABLE jobs ADD KEY status_id (status, id);
-- The redrives of a job (POST /v1/jobs/{id}/redrive answers the existing one again).
ALTER TABLE jobs ADD KEY retry_of (retry_of);
