-- The job table is the source of truth (SPEC §3). Every timestamp is UTC, DATETIME(6).
-- Tenants are stored as raw bytes (VARBINARY) so that comparison is exact byte equality,
-- independent of any collation's idea of which strings are "equal".
CREATE TABLE jobs (
  id                BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
  tenant            VARBINARY(191) NOT NULL,
  rate_key_sha256   CHAR(64) CHARACTER SET ascii COLLATE ascii_bin NULL,
  payload           MEDIUMBLOB NULL,
  status            ENUM('queued','claimed','dispatched','running','succeeded','failed',
                         'canceled','rejected','lost','expired') NOT NULL,
  version           BIGINT UNSIGNED NOT NULL DEFAULT 0,
  attempt           INT UNSIGNED NOT NULL DEFAULT 0,
  dispatch_failures INT UNSIGNED NOT NULL DEFAULT 0,
  refusals          INT UNSIGNED NOT NULL DEFAULT 0,
  caller            VARBINARY(191) NOT NULL DEFAULT '',
  idempotency_key   VARBINARY(255) NULL,
  request_sha256    BINARY(32) NULL,
  queued_at         DATETIME(6) NOT NULL,
  not_before        DATETIME(6) NULL,
  claimed_at        DATETIME(6) NULL,
  dispatched_at     DATETIME(6) NULL,
  started_at        DATETIME(6) NULL,
  finished_at       DATETIME(6) NULL,
  lease_until       DATETIME(6) NULL,
  drainer_id        VARBINARY(191) NULL,
  nonce_sha256      BINARY(32) NULL,
  nonce_expires_at  DATETIME(6) NULL,
  error_code        VARCHAR(64) CHARACTER SET ascii NULL,
  error_message     TEXT CHARACTER SET utf8mb4 NULL,
  result            MEDIUMBLOB NULL,
  retry_of          BIGINT UNSIGNED NULL,
  PRIMARY KEY (id),
  -- Serves the claim (a tenant's queued jobs in (queued_at, id) order, and the distinct tenants
  -- with queued work by a loose index scan), the per-tenant in-flight and depth counts.
  KEY claim (status, tenant, queued_at, id),
  -- Serves recovery: in-flight jobs whose lease has run out.
  KEY lease (status, lease_until),
  -- Serves GET /v1/gates and the gate check: queued jobs per rate key.
  KEY rate_key (status, rate_key_sha256),
  -- Serves listings of one tenant, newest first.
  KEY tenant_id (tenant, id),
  UNIQUE KEY idempotency (tenant, idempotency_key)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- One row per message to publish (SPEC §3, §7). Written in the same transaction as the change
-- it announces; published_at is set only after the broker acknowledged it.
CREATE TABLE outbox (
  id           BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
  subject      VARCHAR(400) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  payload      BLOB NOT NULL,
  created_at   DATETIME(6) NOT NULL,
  published_at DATETIME(6) NULL,
  attempts     INT UNSIGNED NOT NULL DEFAULT 0,
  last_error   TEXT CHARACTER SET utf8mb4 NULL,
  PRIMARY KEY (id),
  -- Unpublished rows in id order; published ones by age for purging.
  KEY unpublished (published_at, id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- Runtime configuration (SPEC §9): every version is a row, so the table is also the history.
-- The newest version is the one in force.
CREATE TABLE config_versions (
  version    BIGINT UNSIGNED NOT NULL,
  config     TEXT CHARACTER SET utf8mb4 NOT NULL,
  changed_by VARCHAR(191) CHARACTER SET utf8mb4 NOT NULL,
  changed_at DATETIME(6) NOT NULL,
  note       TEXT CHARACTER SET utf8mb4 NULL,
  PRIMARY KEY (version)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- Per-tenant rows exist so that admission can lock one row per tenant, which makes the
-- per-tenant depth cap exact under concurrent admissions without locking the job table.
CREATE TABLE tenants (
  tenant     VARBINARY(191) NOT NULL,
  created_at DATETIME(6) NOT NULL,
  PRIMARY KEY (tenant)
) ENGINE=InnoDB;

-- A single row that every claim transaction locks first: claims are serialised, so each one
-- counts in-flight jobs that no concurrent claim can change, and the caps are exact.
CREATE TABLE claim_lock (
  id TINYINT UNSIGNED NOT NULL,
  PRIMARY KEY (id)
) ENGINE=InnoDB;
INSERT INTO claim_lock (id) VALUES (1);

-- Identifies this installation (one database); part of every NATS message id so that two
-- installations publishing to one broker never collide.
CREATE TABLE installation (
  id         TINYINT UNSIGNED NOT NULL,
  install_id CHAR(32) CHARACTER SET ascii NOT NULL,
  created_at DATETIME(6) NOT NULL,
  PRIMARY KEY (id)
) ENGINE=InnoDB;
INSERT INTO installation (id, install_id, created_at)
  VALUES (1, LOWER(REPLACE(UUID(), '-', '')), UTC_TIMESTAMP(6));

-- Drainer heartbeats (SPEC §6 status).
CREATE TABLE drainers (
  id          VARBINARY(191) NOT NULL,
  host        VARCHAR(255) CHARACTER SET utf8mb4 NOT NULL,
  pid         INT UNSIGNED NOT NULL,
  version     VARCHAR(64) CHARACTER SET ascii NOT NULL,
  started_at  DATETIME(6) NOT NULL,
  heartbeat_at DATETIME(6) NOT NULL,
  last_claim_at DATETIME(6) NULL,
  in_flight   INT UNSIGNED NOT NULL DEFAULT 0,
  PRIMARY KEY (id)
) ENGINE=InnoDB;
