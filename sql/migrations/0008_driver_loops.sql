-- What the driver's loops need (design §4): the completion re-check, cancel
-- after N failures, completion callbacks and billing limits.

-- The re-check and the failure loop look at running groups only; without
-- this index they would scan every group ever created. Rows move between
-- the two states once per completion, so it is cheap to keep.
ALTER TABLE job_groups ADD INDEX job_groups_state_threshold (state, cancel_after_n_failures);

-- Running batches without a scan of every batch: the re-check reads the ones
-- whose root group completed, the cancellers and billing limits join them.
ALTER TABLE batches ADD INDEX batches_state (state, batch_id);

-- Completion callbacks. The outbox row says where its callback stands:
--   pending   to be sent, not before callback_next_attempt_ms (0 at first;
--             then the back-off after a failure, or the lease of a driver
--             that is sending it now);
--   sent      a 2xx came back at callback_sent_ms: never sent again;
--   given_up  every attempt failed for the allowed time; callback_error says why;
--   none      the batch has no callback_url.
-- callback_attempts counts POSTs that finished (answered or failed).
ALTER TABLE batch_completions
  ADD COLUMN callback_state ENUM('pending', 'sent', 'given_up', 'none') NOT NULL DEFAULT 'pending',
  ADD COLUMN callback_attempts INT NOT NULL DEFAULT 0,
  ADD COLUMN callback_next_attempt_ms BIGINT NOT NULL DEFAULT 0,
  ADD COLUMN callback_given_up_ms BIGINT NULL,
  ADD COLUMN callback_error VARCHAR(1024) NULL,
  ADD INDEX batch_completions_callback_due (callback_state, callback_next_attempt_ms);

UPDATE batch_completions c
  JOIN batches b ON b.batch_id = c.batch_id
  SET c.callback_state = CASE WHEN c.callback_sent_ms IS NOT NULL THEN 'sent'
                              WHEN b.callback_url IS NULL THEN 'none'
                              ELSE 'pending' END;
