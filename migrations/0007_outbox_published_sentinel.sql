-- published_at becomes NOT NULL, with '1000-01-01 00:00:00' meaning "not yet acknowledged".
-- Marking a row published then updates it in place: a NULL-to-value change grows the row, which
-- costs InnoDB a delete and an insert of the clustered record (41-46 ms per 2,000 rows against
-- 16 ms, measured in the mysql client on 100,000-row tables). Unpublished rows still sort first in
-- the (published_at, id) index, so the relay's claim and the purge's range are unchanged in shape.
UPDATE outbox SET published_at = '1000-01-01 00:00:00' WHERE published_at IS NULL;
ALTER TABLE outbox MODIFY published_at DATETIME(6) NOT NULL DEFAULT '1000-01-01 00:00:00';
