-- Operations (SPEC §6 status, §9 runtime config).
-- A drainer records its poll period, so that /v1/status can judge "no heartbeat for 3 poll
-- periods" without knowing each process's settings, and the time it stopped cleanly, so that a
-- drainer that exited on SIGTERM is not reported as stalled.
ALTER TABLE drainers
  ADD COLUMN poll_interval_ms INT UNSIGNED NOT NULL DEFAULT 1000,
  ADD COLUMN last_poll_at DATETIME(6) NULL,
  ADD COLUMN stopped_at DATETIME(6) NULL;

-- The status page lists drainers by recency.
ALTER TABLE drainers ADD KEY heartbeat (heartbeat_at);

-- A single row that every runtime config change locks first (SPEC §9): changes are serialised,
-- so each reads the version in force and writes exactly the next one; two concurrent changes
-- can never both build on the same version (the primary key of config_versions backs this up).
CREATE TABLE config_lock (
  id TINYINT UNSIGNED NOT NULL,
  PRIMARY KEY (id)
) ENGINE=InnoDB;
INSERT INTO config_lock (id) VALUES (1);
