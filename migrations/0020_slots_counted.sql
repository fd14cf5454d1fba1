-- Whether a slot counts against the limits (SPEC §5a, issue 30 finding 6). A slot granted as
-- shadow-refused (admission_mode shadow, or enforce_for aware and a request without
-- Sluice-Capacity-Aware), or with admission_mode off past a limit, is a slot enforce would have
-- refused: it is granted, so the caller's work goes ahead, but it does not count. Counted, such
-- slots let one producer that loops POST /v1/slots fill the global cap so that no queued job was
-- ever dispatched again. Slots granted within every limit count, in every mode, so the caps stay
-- exact for the jobs in flight and the slots that count together.
--
-- Every reader of what is in flight (the claim, a slot's grant, admission's queue=false check,
-- the tenant page, /v1/status) reads the counted index's range counted = TRUE AND expires_at >
-- NOW(6): bounded by the slots that count, which the global cap bounds, however many uncounted
-- slots a caller takes. The live index stays, for the expiry sweep and for the binaries before
-- this migration, which name it (FORCE INDEX) in every claim until they are restarted: dropping
-- it here would fail their claims for the time between `sluice migrate up` and their restart.
--
-- The column is added at the end with a default: an instant ALTER, every existing slot counts as
-- it did; the index is built in place without blocking writes (the table holds the live slots
-- and the expired ones not yet swept: a few rows).
ALTER TABLE slots ADD COLUMN counted BOOLEAN NOT NULL DEFAULT TRUE, ALGORITHM=INSTANT;
ALTER TABLE slots ADD KEY counted (counted, expires_at, tenant, interactive, lanes), ALGORITHM=INPLACE, LOCK=NONE;
