-- Worker bootstrap without shipping keys (issue 16): a new machine is given
-- only its one-time activation token, makes its own key and exchanges the
-- token, once, for a short-lived certificate bound to its instance name
-- (procedure enroll_instance). time_enrolled_ms records that exchange: set,
-- the token enrolls nothing more. The token still proves the machine at
-- ActivateWorker (with the certificate) and keys its session token.
ALTER TABLE instances
  ADD COLUMN time_enrolled_ms BIGINT NULL AFTER time_activated_ms;
