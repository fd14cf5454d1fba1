-- Admission keeps its tenants' queue state (migration 0010) itself, with one UPDATE per
-- transaction, instead of the insert trigger's UPDATE per row: with the trigger, a 1,000-job
-- batch paid 1,000 updates of 16 tenants rows and their depth index, and batch admission ran at
-- about 0.6 of its rate without it (alternated runs of BenchmarkAdmission, batch half).
--
-- queue_counted marks the rows whose inserter did so; the insert trigger still counts every
-- other queued row (a test's or an operator's raw INSERT), so no insert is left uncounted.
ALTER TABLE jobs ADD COLUMN queue_counted TINYINT(1) NOT NULL DEFAULT 0;

CREATE OR REPLACE TRIGGER jobs_queue_insert AFTER INSERT ON jobs FOR EACH ROW
  UPDATE tenants SET queued = queued + 1,
    head_id = IF(head_id IS NULL OR (NEW.queued_at, NEW.id) < (head_at, head_id), NEW.id, head_id),
    head_at = IF(head_id = NEW.id, NEW.queued_at, head_at)
  WHERE tenant = NEW.tenant AND NEW.status = 'queued' AND NEW.queue_counted = 0;
