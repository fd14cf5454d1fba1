-- A claim that takes several jobs of a tenant counts its tenants' queues itself, in one
-- statement, instead of the update trigger's UPDATE of the tenant's row for each job (issue 31:
-- work per job): one row update a tenant instead of one a job. With 16 jobs a tenant in each
-- 64-job claim the drain ran 1.21x as fast on 0.77x the server's CPU a job
-- (integration/BENCHMARKS.md, session 24); with one job a tenant the trigger stays cheaper.
--
-- Such a claim (store.ClaimJobs) sets @sluice_claim_stamp to its claimed_at before its UPDATE of
-- the jobs, and subtracts the jobs it moved from their tenants' counts right after it, in the same
-- transaction, as the trigger did (the head cleared when a count reaches 0, else left behind for
-- the drainer to set forward: migration 0018). So the trigger leaves alone a job that enters
-- dispatched with claimed_at equal to the session's @sluice_claim_stamp, and counts every other
-- move into or out of queued as before. A claim from a binary older than this migration never sets
-- the variable and is counted by the trigger, so processes of both releases can run side by side
-- during an upgrade. The claim clears the stamp right after its UPDATE, and every claim sets it
-- (or clears it) before its own: two claims may share a stamp, and one left on a pooled
-- connection would make the trigger skip the next claim's jobs.
--
-- The trigger is dropped and created again under LOCK TABLES jobs WRITE, as in 0018, so that no
-- job enters or leaves queued uncounted between the two.
LOCK TABLES jobs WRITE;
DROP TRIGGER jobs_queue_update;

CREATE TRIGGER jobs_queue_update AFTER UPDATE ON jobs FOR EACH ROW
  IF (OLD.status = 'queued') <> (NEW.status = 'queued') THEN
    IF NEW.status = 'dispatched' THEN
      IF @sluice_claim_stamp IS NULL OR NOT (NEW.claimed_at <=> @sluice_claim_stamp) THEN
      -- MariaDB assigns SET columns left to right: the head sees the new count.
      UPDATE tenants SET queued = queued - 1,
        head_id = IF(queued = 0, NULL, head_id),
        head_at = IF(queued = 0, NULL, head_at)
      WHERE tenant = OLD.tenant; END IF; ELSE
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

UNLOCK TABLES;
