-- Creates a batch and its root job group (id 0). Idempotent under
-- (user, idempotency_token): a retried call returns the same batch with
-- created = 0. in_request_digest is what the call asked for (migration
-- 0027): a token reused with a different digest is refused, rc 5 with the
-- batch's id, rather than answered with a batch that is not the one asked
-- for; a batch stored without a digest, or a call without one, is matched
-- on the token alone, as before. in_attributes: [{"key", "value"}].
DROP PROCEDURE IF EXISTS create_batch;
DELIMITER $$
CREATE PROCEDURE create_batch(IN in_user VARCHAR(100), IN in_billing_project VARCHAR(100),
                              IN in_idempotency_token VARCHAR(100), IN in_request_digest CHAR(64),
                              IN in_callback_url VARCHAR(2048),
                              IN in_cancel_after_n_failures INT, IN in_attributes JSON, IN in_now_ms BIGINT)
proc: BEGIN
  DECLARE v_batch_id BIGINT;
  DECLARE v_digest CHAR(64);
  DECLARE v_over_limit VARCHAR(512);
  DECLARE v_state VARCHAR(20);
  DECLARE v_missing BOOLEAN DEFAULT FALSE;
  DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_missing = TRUE;
  DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;
  -- 1062 (duplicate key): a concurrent call with the same token committed
  -- first; return its batch (refused as below if it asked for another).
  DECLARE EXIT HANDLER FOR 1062
  BEGIN
    ROLLBACK;
    SELECT IF(request_digest <> in_request_digest, 5, 0) AS rc,
           IF(request_digest <> in_request_digest,
              CONCAT('idempotency token "', in_idempotency_token, '" was used for batch ', batch_id,
                     ' with a different request'), 'exists') AS message,
           batch_id, 0 AS created
      FROM batches WHERE user = in_user AND idempotency_token = in_idempotency_token;
  END;

  IF in_attributes IS NOT NULL AND JSON_TYPE(in_attributes) <> 'ARRAY' THEN
    SELECT 3 AS rc, 'attributes must be a JSON array of {key, value}' AS message;
    LEAVE proc;
  END IF;
  IF in_cancel_after_n_failures IS NOT NULL AND in_cancel_after_n_failures < 1 THEN
    SELECT 3 AS rc, 'cancel_after_n_failures must be at least 1' AS message;
    LEAVE proc;
  END IF;
  START TRANSACTION;
  IF in_idempotency_token IS NOT NULL THEN
    SELECT batch_id, request_digest INTO v_batch_id, v_digest FROM batches
      WHERE user = in_user AND idempotency_token = in_idempotency_token;
    -- (<> is NULL, not true, when either digest is NULL: matched on the token alone.)
    IF v_batch_id IS NOT NULL AND v_digest <> in_request_digest THEN
      ROLLBACK;
      SELECT 5 AS rc, CONCAT('idempotency token "', in_idempotency_token, '" was used for batch ', v_batch_id,
                             ' with a different request') AS message, v_batch_id AS batch_id;
      LEAVE proc;
    END IF;
    IF v_batch_id IS NOT NULL THEN
      COMMIT;
      SELECT 0 AS rc, 'exists' AS message, v_batch_id AS batch_id, 0 AS created;
      LEAVE proc;
    END IF;
  END IF;
  SELECT state INTO v_state FROM billing_projects WHERE name = in_billing_project LOCK IN SHARE MODE;
  IF v_state IS NULL THEN
    ROLLBACK;
    SELECT 1 AS rc, CONCAT('no billing project ', in_billing_project) AS message;
    LEAVE proc;
  END IF;
  -- Membership before state: a non-member learns nothing of the project's state.
  IF NOT EXISTS (SELECT 1 FROM billing_project_members
                 WHERE billing_project = in_billing_project AND user = in_user) THEN
    ROLLBACK;
    SELECT 6 AS rc, CONCAT(in_user, ' is not a member of billing project ', in_billing_project) AS message;
    LEAVE proc;
  END IF;
  IF v_state <> 'open' THEN
    ROLLBACK;
    SELECT 2 AS rc, CONCAT('billing project ', in_billing_project, ' is ', v_state) AS message;
    LEAVE proc;
  END IF;
  -- A project whose spend reached its limit takes no new work (migration 0013; a limit of 0 takes none).
  CALL billing_limit_check(in_billing_project, v_over_limit);
  IF v_over_limit IS NOT NULL THEN
    ROLLBACK;
    SELECT 2 AS rc, v_over_limit AS message;
    LEAVE proc;
  END IF;
  INSERT INTO batches (user, billing_project, idempotency_token, request_digest, callback_url, time_created_ms)
    VALUES (in_user, in_billing_project, in_idempotency_token, in_request_digest, in_callback_url, in_now_ms);
  SET v_batch_id = LAST_INSERT_ID();
  INSERT INTO job_groups (batch_id, job_group_id, parent_id, update_id, depth, cancel_after_n_failures, time_created_ms)
    VALUES (v_batch_id, 0, NULL, NULL, 0, in_cancel_after_n_failures, in_now_ms);
  INSERT INTO job_group_self_and_ancestors (batch_id, job_group_id, ancestor_id, level)
    VALUES (v_batch_id, 0, 0, 0);
  IF in_attributes IS NOT NULL THEN
    INSERT INTO batch_attributes (batch_id, `key`, `value`)
      SELECT v_batch_id, jt.k, jt.v
      FROM JSON_TABLE(in_attributes, '$[*]' COLUMNS (k VARCHAR(100) PATH '$.key', v TEXT PATH '$.value')) jt;
  END IF;
  COMMIT;
  SELECT 0 AS rc, 'created' AS message, v_batch_id AS batch_id, 1 AS created;
END $$
DELIMITER ;
