-- A redrive's link to the job it redrives moves out of the jobs' `retry_of` index into
-- job_redrives, a small table written only for redrives (issue 31: work per job). Every job row
-- paid an entry of that index at its insert and its purge, NULL for all but redrives; the index
-- served one read, an admission's lookup of the job an earlier redrive of the same job created
-- (store.ReadAdmission), which reads job_redrives instead. The column stays: a job still shows
-- its retry_of. As job_priorities (0022) and job_deadlines (0021): no index on jobs for a rare
-- feature. Batch admission, whose every job paid the entry, ran 1.025x as fast (worse in 2 of 8
-- alternated rounds: `SLUICE_BENCH_ONLY=batch make benchcmp BASE=d4006bc ROUNDS=8
-- BENCH='BenchmarkAdmission$$'`); the drain and single admission moved within the noise.
--
-- Every job that names retry_of has its row, the rejected ones too (a redrive refused is what a
-- later redrive of the same job replays, as before). The existing links are copied through the
-- index before it is dropped. A process older than this migration records no link for a
-- redrive it admits, so a later redrive of the same job through a new process admits a second
-- job instead of replaying the first; and its own lookup reads jobs without the index. Restart
-- the units right after the migration (deploy/RUNBOOK.md).
CREATE TABLE job_redrives (
  retry_of BIGINT UNSIGNED NOT NULL,
  job_id   BIGINT UNSIGNED NOT NULL,
  PRIMARY KEY (retry_of, job_id),
  KEY job_id (job_id)
) ENGINE=InnoDB;

INSERT INTO job_redrives (retry_of, job_id)
  SELECT retry_of, id FROM jobs FORCE INDEX (retry_of) WHERE retry_of IS NOT NULL;

ALTER TABLE jobs DROP INDEX retry_of, ALGORITHM=INPLACE, LOCK=NONE;
