-- Admission keeps its tenants' queue state (migration 0010) itself, with one UPDATE per
-- transaction (gate/insert.go, queueCountSQL), and the insert trigger goes: a trigger costs every
-- inserted row even when it does nothing. With the trigger's UPDATE per row, batch admission ran
-- at about 0.6 of its rate without it; with a trigger that skipped admission's rows, 13 % below
-- one without any (alternated SLUICE_BENCH_ONLY=batch runs of BenchmarkAdmission, loaded machine:
-- 23,802 and 26,247 against 29,919 and 27,341 jobs/s).
--
-- Admission is the only code that inserts queued jobs. Anything else that does (a test, an
-- operator's raw INSERT) must recount: store.RecountQueues, the backfill statement of 0010.
-- Jobs leaving or re-entering queued (claim, requeue, cancel, expiry, delete) are still counted
-- by the update and delete triggers.
DROP TRIGGER jobs_queue_insert;

-- Signed, so that a count that ever drifted (a raw INSERT nobody recounted) shows as a wrong
-- number in /v1/status instead of failing, out of range, the claim that decrements it.
ALTER TABLE tenants MODIFY queued INT NOT NULL DEFAULT 0;
