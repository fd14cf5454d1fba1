-- The nonce of the last dispatch that recovery or a requeue voided. An executor that confirms
-- with it is told dispatch_void (the job was taken back) rather than nonce_invalid (a nonce sluice
-- never minted for this job).
ALTER TABLE jobs ADD COLUMN voided_nonce_sha256 BINARY(32) NULL AFTER nonce_expires_at;
