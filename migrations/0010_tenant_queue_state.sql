-- Each tenant's queue state, kept on its tenants row (issue 17, SPEC §5 "the cost of choosing
-- the next job must not grow ... with the number of tenants"): how many jobs it has queued, and
-- its oldest queued job (head_at, head_id) = the smallest (queued_at, id) in `queued`, NULL when
-- it has none. A claim pass reads the next tenants to serve from the head index, a number of rows
-- bounded by the free slots, instead of probing every tenant that ever had work; /v1/status reads
-- the deepest tenants from the depth index.
--
-- Triggers on jobs keep the state, so every statement that moves a job into or out of `queued`
-- (admission, claim, requeue, cancel, expiry, a test's raw INSERT) updates it in its own
-- transaction: it can never disagree with the jobs it describes, and no code path can forget it.
-- Only such moves touch the tenants row; an outcome (dispatched → succeeded) does not. The head is
-- recomputed by one probe of the claim index, and only when the head itself leaves `queued`.
--
-- Three statements, so that an installation with many tenants upgrades online: the columns are
-- instant and the indexes built while tenants are written. In one statement MariaDB refuses to
-- add a virtual column with anything else in place and copies the table instead (LOCK=SHARED:
-- admissions and claims blocked for 6 s per million tenants, integration/migration_locks_bench_test.go).
ALTER TABLE tenants
  ADD COLUMN queued INT UNSIGNED NOT NULL DEFAULT 0,
  ADD COLUMN head_at DATETIME(6) NULL,
  ADD COLUMN head_id BIGINT UNSIGNED NULL, ALGORITHM=INSTANT;
-- The tenant's name while it has queued work, NULL otherwise: round_robin reads the next tenants
-- with work in name order from this index, never walking idle tenants.
ALTER TABLE tenants ADD COLUMN work_tenant VARBINARY(191) AS (IF(head_id IS NULL, NULL, tenant)) VIRTUAL, ALGORITHM=INSTANT;
ALTER TABLE tenants
  -- fair and fifo: tenants with work by their oldest queued job (IS NOT NULL skips idle ones).
  ADD KEY head (head_at, head_id),
  ADD KEY work_tenant (work_tenant),
  -- /v1/status and GET /v1/tenants?order=depth: the deepest tenants first.
  ADD KEY depth (queued, tenant), ALGORITHM=INPLACE, LOCK=NONE;

-- MariaDB assigns SET columns left to right, each seeing the ones before it: head_at follows the
-- head_id just chosen.
CREATE TRIGGER jobs_queue_insert AFTER INSERT ON jobs FOR EACH ROW
  UPDATE tenants SET queued = queued + 1,
    head_id = IF(head_id IS NULL OR (NEW.queued_at, NEW.id) < (head_at, head_id), NEW.id, head_id),
    head_at = IF(head_id = NEW.id, NEW.queued_at, head_at)
  WHERE tenant = NEW.tenant AND NEW.status = 'queued';

CREATE TRIGGER jobs_queue_update AFTER UPDATE ON jobs FOR EACH ROW
  UPDATE tenants SET queued = queued + (NEW.status = 'queued') - (OLD.status = 'queued'),
    head_id = IF(NEW.status = 'queued',
      IF(head_id IS NULL OR (NEW.queued_at, NEW.id) < (head_at, head_id), NEW.id, head_id),
      IF(head_id = OLD.id,
        (SELECT id FROM jobs FORCE INDEX (claim) WHERE status = 'queued' AND tenant = OLD.tenant
          ORDER BY queued_at, id LIMIT 1),
        head_id)),
    head_at = (SELECT queued_at FROM jobs WHERE id = head_id)
  WHERE tenant = OLD.tenant AND (OLD.status = 'queued') <> (NEW.status = 'queued');

CREATE TRIGGER jobs_queue_delete AFTER DELETE ON jobs FOR EACH ROW
  UPDATE tenants SET queued = queued - 1,
    head_id = IF(head_id = OLD.id,
      (SELECT id FROM jobs FORCE INDEX (claim) WHERE status = 'queued' AND tenant = OLD.tenant
        ORDER BY queued_at, id LIMIT 1),
      head_id),
    head_at = (SELECT queued_at FROM jobs WHERE id = head_id)
  WHERE tenant = OLD.tenant AND OLD.status = 'queued';

-- Jobs queued before the triggers existed. Each tenant's row is recomputed under its row lock,
-- after the triggers were created, so a job admitted meanwhile is counted exactly once. The one
-- statement holds every tenant's row until it ends: admissions and claims wait for it, 7 s per
-- million tenants (with a job in ten queued; deploy/RUNBOOK.md).
UPDATE tenants t SET
  queued = (SELECT COUNT(*) FROM jobs j FORCE INDEX (claim) WHERE j.status = 'queued' AND j.tenant = t.tenant),
  head_id = (SELECT j.id FROM jobs j FORCE INDEX (claim) WHERE j.status = 'queued' AND j.tenant = t.tenant
    ORDER BY j.queued_at, j.id LIMIT 1),
  head_at = (SELECT j.queued_at FROM jobs j WHERE j.id = t.head_id);
