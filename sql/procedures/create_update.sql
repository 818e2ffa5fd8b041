-- Reserves a contiguous block of job ids and job group ids for a new update
-- of a batch, so several clients can then insert its jobs in parallel
-- without touching the batch row. Idempotent under (batch, token), and a
-- token reused with a different in_request_digest is refused (rc 5 with the
-- update's id; migration 0027: a row or call without a digest is matched on
-- the token alone, as before). Refused
-- for a cancelled or deleted batch, or one whose billing project is not open,
-- and when the update would take the batch past in_max_jobs_per_batch (rc 3)
-- or its owner or project past their open jobs (rc 7; see
-- job_limits_check; each limit NULL for none). With a project limit the
-- project row is locked exclusively, so concurrent updates of one project
-- are counted one after the other; the per-user count is exact only within
-- one project (updates of one user in several projects at once may pass it
-- by up to their own sizes).
DROP PROCEDURE IF EXISTS create_update;
DELIMITER $$
CREATE PROCEDURE create_update(IN in_batch_id BIGINT, IN in_idempotency_token VARCHAR(100),
                               IN in_request_digest CHAR(64),
                               IN in_n_jobs INT, IN in_n_job_groups INT, IN in_now_ms BIGINT,
                               IN in_trace_context VARCHAR(1024), IN in_max_jobs_per_batch INT,
                               IN in_max_open_jobs_per_user BIGINT, IN in_max_open_jobs_per_project BIGINT)
proc: BEGIN
  DECLARE v_update_id INT;
  DECLARE v_digest CHAR(64);
  DECLARE v_over_limit VARCHAR(512);
  DECLARE v_start_job_id INT;
  DECLARE v_start_job_group_id INT;
  DECLARE v_deleted BOOLEAN;
  DECLARE v_billing_project VARCHAR(100);
  DECLARE v_project_state VARCHAR(20);
  DECLARE v_user VARCHAR(100);
  DECLARE v_rc INT;
  DECLARE v_message VARCHAR(1024);
  DECLARE v_missing BOOLEAN DEFAULT FALSE;
  DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_missing = TRUE;
  DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;

  IF in_n_jobs IS NULL OR in_n_jobs < 0 OR in_n_job_groups IS NULL OR in_n_job_groups < 0 THEN
    SELECT 3 AS rc, 'n_jobs and n_job_groups must be non-negative' AS message;
    LEAVE proc;
  END IF;
  START TRANSACTION;
  -- Lock order: the billing project (shared: it must stay open while we
  -- add work to it; exclusive when its open jobs are counted) before the batch.
  SELECT billing_project INTO v_billing_project FROM batches WHERE batch_id = in_batch_id;
  IF in_max_open_jobs_per_project IS NULL THEN
    SELECT state INTO v_project_state FROM billing_projects WHERE name = v_billing_project LOCK IN SHARE MODE;
  ELSE
    SELECT state INTO v_project_state FROM billing_projects WHERE name = v_billing_project FOR UPDATE;
  END IF;
  SELECT deleted, user INTO v_deleted, v_user FROM batches WHERE batch_id = in_batch_id FOR UPDATE;
  IF v_missing OR v_deleted THEN
    ROLLBACK;
    SELECT 1 AS rc, CONCAT('no batch ', in_batch_id) AS message;
    LEAVE proc;
  END IF;
  IF in_idempotency_token IS NOT NULL THEN
    SELECT update_id, start_job_id, start_job_group_id, request_digest
      INTO v_update_id, v_start_job_id, v_start_job_group_id, v_digest
      FROM batch_updates WHERE batch_id = in_batch_id AND idempotency_token = in_idempotency_token;
    -- (<> is NULL, not true, when either digest is NULL: matched on the token alone.)
    IF NOT v_missing AND v_digest <> in_request_digest THEN
      ROLLBACK;
      SELECT 5 AS rc, CONCAT('idempotency token "', in_idempotency_token, '" was used for update ', v_update_id,
                             ' of batch ', in_batch_id, ' with a different request') AS message,
             v_update_id AS update_id;
      LEAVE proc;
    END IF;
    IF NOT v_missing THEN
      COMMIT;
      SELECT 0 AS rc, 'exists' AS message, v_update_id AS update_id, v_start_job_id AS start_job_id,
             v_start_job_group_id AS start_job_group_id;
      LEAVE proc;
    END IF;
    SET v_missing = FALSE;
  END IF;
  IF v_project_state <> 'open' THEN
    ROLLBACK;
    SELECT 2 AS rc, CONCAT('billing project ', v_billing_project, ' is ', v_project_state) AS message;
    LEAVE proc;
  END IF;
  -- A project whose spend reached its limit takes no new work (migration 0013; a limit of 0 takes none).
  CALL billing_limit_check(v_billing_project, v_over_limit);
  IF v_over_limit IS NOT NULL THEN
    ROLLBACK;
    SELECT 2 AS rc, v_over_limit AS message;
    LEAVE proc;
  END IF;
  IF EXISTS (SELECT 1 FROM job_groups_cancelled WHERE batch_id = in_batch_id AND job_group_id = 0) THEN
    ROLLBACK;
    SELECT 2 AS rc, CONCAT('batch ', in_batch_id, ' is cancelled') AS message;
    LEAVE proc;
  END IF;
  CALL job_limits_check(in_batch_id, v_user, v_billing_project, in_n_jobs, in_max_jobs_per_batch,
                        in_max_open_jobs_per_user, in_max_open_jobs_per_project, v_rc, v_message);
  IF v_rc <> 0 THEN
    ROLLBACK;
    SELECT v_rc AS rc, v_message AS message;
    LEAVE proc;
  END IF;
  SELECT n_updates + 1, n_reserved_jobs + 1, n_reserved_job_groups + 1
    INTO v_update_id, v_start_job_id, v_start_job_group_id
    FROM batches WHERE batch_id = in_batch_id;
  UPDATE batches
    SET n_updates = n_updates + 1,
        n_reserved_jobs = n_reserved_jobs + in_n_jobs,
        n_reserved_job_groups = n_reserved_job_groups + in_n_job_groups
    WHERE batch_id = in_batch_id;
  INSERT INTO batch_updates (batch_id, update_id, idempotency_token, request_digest, start_job_id, n_jobs,
                             start_job_group_id, n_job_groups, time_created_ms, trace_context)
    VALUES (in_batch_id, v_update_id, in_idempotency_token, in_request_digest, v_start_job_id, in_n_jobs,
            v_start_job_group_id, in_n_job_groups, in_now_ms, in_trace_context);
  COMMIT;
  SELECT 0 AS rc, 'created' AS message, v_update_id AS update_id, v_start_job_id AS start_job_id,
         v_start_job_group_id AS start_job_group_id;
END $$
DELIMITER ;
