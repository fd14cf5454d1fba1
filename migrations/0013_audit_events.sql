-- The audit trail of SPEC §10: one row per admission decision and per job transition, written in
-- the transaction of the decision it records (a refusal that writes nothing else comes through a
-- bounded queue in the process, flushed in batches). `at` is the database's clock; `id` orders
-- the rows of one instant. detail is a small JSON object: the limits and counts that decided.
CREATE TABLE audit_events (
  id          BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
  at          DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
  event       VARCHAR(32) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  tenant      VARBINARY(191) NOT NULL DEFAULT '',
  job_id      BIGINT UNSIGNED NULL,
  slot_id     VARBINARY(191) NULL,
  actor       VARBINARY(191) NOT NULL DEFAULT '',
  from_status VARCHAR(16) CHARACTER SET ascii COLLATE ascii_bin NULL,
  to_status   VARCHAR(16) CHARACTER SET ascii COLLATE ascii_bin NULL,
  version     BIGINT UNSIGNED NULL,
  attempt     INT UNSIGNED NULL,
  error_code  VARCHAR(64) CHARACTER SET ascii NULL,
  scope       VARCHAR(32) CHARACTER SET ascii COLLATE ascii_bin NULL,
  detail      TEXT CHARACTER SET utf8mb4 NULL,
  PRIMARY KEY (id),
  -- A job's story, oldest first (GET /v1/jobs/{id}/events).
  KEY job (job_id, id),
  -- GET /v1/audit, newest first, by tenant or by event.
  KEY tenant (tenant, id),
  KEY event (event, id),
  -- The retention purge, oldest first.
  KEY at (at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
