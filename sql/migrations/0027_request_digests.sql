-- What a call with an idempotency token asked for (issue 36): the SHA-256,
-- in 64 lowercase hex digits, of the request message without its token,
-- computed by the frontend (services/frontend/request_digest.py). A call
-- that reuses a token with the same request finds what the first made; with
-- a different request it is refused (rc 5), so that a changed batch file
-- submitted under an old token is not answered with the old batch.
-- NULL for rows made before this migration, and for callers that send no
-- digest: those keep the behaviour before it (the token alone decides).
ALTER TABLE batches
  ADD COLUMN request_digest CHAR(64) CHARACTER SET ascii COLLATE ascii_bin NULL;
ALTER TABLE batch_updates
  ADD COLUMN request_digest CHAR(64) CHARACTER SET ascii COLLATE ascii_bin NULL;
