-- Outbox rows the broker refused permanently (too large, invalid subject): moved here by the
-- relay in the transaction that would have marked them published, so that one poison row never
-- blocks the rows behind it and stays visible with its error (`sluice outbox status`).
CREATE TABLE outbox_failed (
  id         BIGINT UNSIGNED NOT NULL,
  subject    VARCHAR(400) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  payload    BLOB NOT NULL,
  created_at DATETIME(6) NOT NULL,
  failed_at  DATETIME(6) NOT NULL,
  attempts   INT UNSIGNED NOT NULL DEFAULT 0,
  error      TEXT CHARACTER SET utf8mb4 NOT NULL,
  PRIMARY KEY (id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- One row per deliberate replay (`sluice outbox replay`). Its id is the n of the replayed
-- messages' ids (<installation id>-<row id>-r<n>), so two replays never share a message id and
-- the broker's duplicate window never swallows a replay.
CREATE TABLE outbox_replays (
  id          BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
  started_at  DATETIME(6) NOT NULL,
  from_id     BIGINT UNSIGNED NULL,
  since       DATETIME(6) NULL,
  finished_at DATETIME(6) NULL,
  published   BIGINT UNSIGNED NOT NULL DEFAULT 0,
  PRIMARY KEY (id)
) ENGINE=InnoDB;
