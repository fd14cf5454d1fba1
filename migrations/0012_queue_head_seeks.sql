-- The triggers of migration 0010 found a tenant's new head (its oldest queued job, after the head
-- left queued) by reading the claim index from the start of the tenant's queued range. The jobs
-- claimed before it stay in that range as delete-marked entries until purge catches up, and under
-- a steady drain the probe stepped over each of them, looking up its clustered row every time:
-- about 30 more page reads per claimed job than it needs (Innodb_buffer_pool_read_requests over
-- two 20,000-job drains of BenchmarkDrainThroughput: 8.6-8.9 million with the old probe, 7.2-7.7
-- million with this one, 5.8-6.1 million with no head kept at all).
--
-- The head that leaves was the oldest queued job, so the next one comes after it in (queued_at,
-- id) order: the probe now seeks there, in two exact index dives, since MariaDB does not seek to a
-- row-constructor bound: a job queued in the same instant with a larger id (one batch admission
-- queues all its jobs at one instant), else the first job queued later.
--
-- The statements also run only for a job that enters or leaves queued: an outcome of a job in
-- flight (half of all job updates in a drain) no longer runs an UPDATE of tenants that matches
-- nothing.
--
-- Each trigger is dropped and created again under LOCK TABLES jobs WRITE: without it, a job that
-- entered or left queued between the DROP and the CREATE (an admission or a claim of a process
-- still running during the upgrade) would not be counted in its tenant's queue state, ever. Writes
-- to jobs wait the few milliseconds the swap takes.
LOCK TABLES jobs WRITE;
DROP TRIGGER jobs_queue_update;

CREATE TRIGGER jobs_queue_update AFTER UPDATE ON jobs FOR EACH ROW
  IF (OLD.status = 'queued') <> (NEW.status = 'queued') THEN
  UPDATE tenants SET queued = queued + (NEW.status = 'queued') - (OLD.status = 'queued'),
    head_id = IF(NEW.status = 'queued',
      IF(head_id IS NULL OR (NEW.queued_at, NEW.id) < (head_at, head_id), NEW.id, head_id),
      IF(head_id = OLD.id,
        COALESCE(
          (SELECT id FROM jobs FORCE INDEX (claim) WHERE status = 'queued' AND tenant = OLD.tenant
            AND queued_at = OLD.queued_at AND id > OLD.id ORDER BY id LIMIT 1),
          (SELECT id FROM jobs FORCE INDEX (claim) WHERE status = 'queued' AND tenant = OLD.tenant
            AND queued_at > OLD.queued_at ORDER BY queued_at, id LIMIT 1)),
        head_id)),
    head_at = (SELECT queued_at FROM jobs WHERE id = head_id)
  WHERE tenant = OLD.tenant; END IF;

DROP TRIGGER jobs_queue_delete;

CREATE TRIGGER jobs_queue_delete AFTER DELETE ON jobs FOR EACH ROW
  IF OLD.status = 'queued' THEN
  UPDATE tenants SET queued = queued - 1,
    head_id = IF(head_id = OLD.id,
      COALESCE(
        (SELECT id FROM jobs FORCE INDEX (claim) WHERE status = 'queued' AND tenant = OLD.tenant
          AND queued_at = OLD.queued_at AND id > OLD.id ORDER BY id LIMIT 1),
        (SELECT id FROM jobs FORCE INDEX (claim) WHERE status = 'queued' AND tenant = OLD.tenant
          AND queued_at > OLD.queued_at ORDER BY queued_at, id LIMIT 1)),
      head_id),
    head_at = (SELECT queued_at FROM jobs WHERE id = head_id)
  WHERE tenant = OLD.tenant; END IF;

UNLOCK TABLES;
