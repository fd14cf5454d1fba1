-- The claim no longer finds its tenants' new heads (issue 17, SPEC §14: drain throughput). Under
-- the triggers of migration 0012 every claimed job ran an UPDATE of its tenant's row that probed
-- the claim index for the next head, looked up its queued_at and rewrote the head index entry:
-- about 35 page reads and a fifth of the server's CPU per drained job (integration/BENCHMARKS.md,
-- sessions 9 and 10), and a drain claims one job per tenant per pass, so no two claims of a
-- tenant share that work.
--
-- A tenant's head (head_at, head_id) is now a lower bound: no queued job of the tenant comes
-- before it in (queued_at, id) order, and it is NULL exactly when the tenant has nothing queued.
-- A job entering queued still lowers the head to itself when it goes first (it can never be
-- later than the oldest queued job), and the count stays exact in every transition. A job that
-- leaves queued by a claim (queued to dispatched) leaves the head where it was unless the
-- tenant's count reaches 0; the drainer that claimed it sets the head forward a little later,
-- for all the tenants it claimed from at once (store.AdvanceHeads), so a head lags the truth by
-- the claims of the last advance interval. Other moves out of queued (cancel, expiry, a release)
-- still seek the next head when the head itself leaves, after it, as 0012 did; since the head
-- may already be behind, the head is also cleared whenever the count reaches 0, and a head left
-- behind keeps its head_at even once its job is purged (head_at is only looked up for a new
-- head_id).
--
-- Each trigger is dropped and created again under LOCK TABLES jobs WRITE: without it, a job that
-- entered or left queued between the DROP and the CREATE (an admission or a claim of a process
-- still running during the upgrade) would not be counted in its tenant's queue state, ever. Writes
-- to jobs wait the few milliseconds the swap takes.
LOCK TABLES jobs WRITE;
DROP TRIGGER jobs_queue_update;

CREATE TRIGGER jobs_queue_update AFTER UPDATE ON jobs FOR EACH ROW
  IF (OLD.status = 'queued') <> (NEW.status = 'queued') THEN
    IF NEW.status = 'dispatched' THEN
      -- MariaDB assigns SET columns left to right: the head sees the new count.
      UPDATE tenants SET queued = queued - 1,
        head_id = IF(queued = 0, NULL, head_id),
        head_at = IF(queued = 0, NULL, head_at)
      WHERE tenant = OLD.tenant; ELSE
      UPDATE tenants SET queued = queued + (NEW.status = 'queued') - (OLD.status = 'queued'),
        head_id = IF(NEW.status = 'queued',
          IF(head_id IS NULL OR (NEW.queued_at, NEW.id) < (head_at, head_id), NEW.id, head_id),
          IF(queued = 0, NULL, IF(head_id = OLD.id,
            COALESCE(
              (SELECT id FROM jobs FORCE INDEX (claim) WHERE status = 'queued' AND tenant = OLD.tenant
                AND queued_at = OLD.queued_at AND id > OLD.id ORDER BY id LIMIT 1),
              (SELECT id FROM jobs FORCE INDEX (claim) WHERE status = 'queued' AND tenant = OLD.tenant
                AND queued_at > OLD.queued_at ORDER BY queued_at, id LIMIT 1)),
            head_id))),
        head_at = IF(head_id IS NULL, NULL, COALESCE((SELECT queued_at FROM jobs WHERE id = head_id), head_at))
      WHERE tenant = OLD.tenant; END IF; END IF;

DROP TRIGGER jobs_queue_delete;

CREATE TRIGGER jobs_queue_delete AFTER DELETE ON jobs FOR EACH ROW
  IF OLD.status = 'queued' THEN
  UPDATE tenants SET queued = queued - 1,
    head_id = IF(queued = 0, NULL, IF(head_id = OLD.id,
      COALESCE(
        (SELECT id FROM jobs FORCE INDEX (claim) WHERE status = 'queued' AND tenant = OLD.tenant
          AND queued_at = OLD.queued_at AND id > OLD.id ORDER BY id LIMIT 1),
        (SELECT id FROM jobs FORCE INDEX (claim) WHERE status = 'queued' AND tenant = OLD.tenant
          AND queued_at > OLD.queued_at ORDER BY queued_at, id LIMIT 1)),
      head_id)),
    head_at = IF(head_id IS NULL, NULL, COALESCE((SELECT queued_at FROM jobs WHERE id = head_id), head_at))
  WHERE tenant = OLD.tenant; END IF;

UNLOCK TABLES;
