-- The frontend's check before CreateBatch or SubmitBatch writes anything:
-- may a new batch of in_user in in_billing_project reserve in_n_jobs jobs
-- (job_limits_check; a limit NULL is none)? A batch that exists already for
-- (in_user, in_idempotency_token) passes: the call is a retry, and its
-- update exists too (create_update returns it without checking again). So
-- does a user who is not a member of the project: create_batch refuses them,
-- and the project's count is not theirs to learn.
-- Reads only; create_update checks again, under its locks. Returns the
-- status row: rc 0, 3 or 7 with the message of job_limits_check.
DROP PROCEDURE IF EXISTS check_job_limits;
DELIMITER $$
CREATE PROCEDURE check_job_limits(IN in_user VARCHAR(100), IN in_billing_project VARCHAR(100),
                                  IN in_idempotency_token VARCHAR(100), IN in_n_jobs INT,
                                  IN in_max_jobs_per_batch INT, IN in_max_open_jobs_per_user BIGINT,
                                  IN in_max_open_jobs_per_project BIGINT)
proc: BEGIN
  DECLARE v_rc INT;
  DECLARE v_message VARCHAR(1024);

  IF in_n_jobs IS NULL OR in_n_jobs < 0 THEN
    SELECT 3 AS rc, 'n_jobs must be non-negative' AS message;
    LEAVE proc;
  END IF;
  IF in_idempotency_token IS NOT NULL
     AND EXISTS (SELECT 1 FROM batches WHERE user = in_user AND idempotency_token = in_idempotency_token) THEN
    SELECT 0 AS rc, 'exists' AS message;
    LEAVE proc;
  END IF;
  IF NOT EXISTS (SELECT 1 FROM billing_project_members
                 WHERE billing_project = in_billing_project AND user = in_user) THEN
    SELECT 0 AS rc, 'not a member: create_batch refuses' AS message;
    LEAVE proc;
  END IF;
  CALL job_limits_check(NULL, in_user, in_billing_project, in_n_jobs, in_max_jobs_per_batch,
                        in_max_open_jobs_per_user, in_max_open_jobs_per_project, v_rc, v_message);
  SELECT v_rc AS rc, v_message AS message;
END $$
DELIMITER ;
