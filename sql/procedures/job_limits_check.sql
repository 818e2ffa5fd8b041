-- Internal (create_update, rerun_failed_jobs, check_job_limits): may
-- in_n_new_jobs more jobs be reserved for batch in_batch_id (NULL: a batch
-- not created yet) of in_user in in_billing_project? Each limit is NULL for
-- none. out_rc 0 if so; otherwise
--   3 (INVALID_ARGUMENT)    the batch would have more than
--                           in_max_jobs_per_batch jobs (reserved ids count:
--                           an update not committed yet is still promised);
--   7 (RESOURCE_EXHAUSTED)  the user's or the project's open jobs would pass
--                           in_max_open_jobs_per_user / _per_project, or
--                           the max_ready_jobs of the user's or the
--                           project's quota (migration 0031; counted the
--                           same way, and only when such a quota is set);
-- and out_message names the limit and its value.
--
-- Open jobs, counted without reading jobs: over the owner's (or project's)
-- batches that are open or running (batches_user_state,
-- batches_billing_project_state), the jobs promised to each (its reserved
-- ids; only its committed n_jobs once it is cancelled, since nothing more
-- can be committed to it) minus the completed ones (the root group's token
-- rows, at most 64 per batch). A complete batch has none. The cost grows
-- with the number of unfinished batches, not of jobs.
DROP PROCEDURE IF EXISTS job_limits_check;
DELIMITER $$
CREATE PROCEDURE job_limits_check(IN in_batch_id BIGINT, IN in_user VARCHAR(100),
                                  IN in_billing_project VARCHAR(100), IN in_n_new_jobs INT,
                                  IN in_max_jobs_per_batch INT, IN in_max_open_jobs_per_user BIGINT,
                                  IN in_max_open_jobs_per_project BIGINT,
                                  OUT out_rc INT, OUT out_message VARCHAR(1024))
BEGIN
  DECLARE v_reserved BIGINT DEFAULT 0;
  DECLARE v_open BIGINT;
  DECLARE v_user_quota BIGINT DEFAULT NULL;
  DECLARE v_project_quota BIGINT DEFAULT NULL;

  SET out_rc = 0, out_message = 'ok';
  SELECT MAX(IF(kind = 'user', max_ready_jobs, NULL)), MAX(IF(kind = 'project', max_ready_jobs, NULL))
    INTO v_user_quota, v_project_quota
    FROM quotas WHERE (kind = 'user' AND name = in_user) OR (kind = 'project' AND name = in_billing_project);
  IF in_max_jobs_per_batch IS NOT NULL THEN
    IF in_batch_id IS NOT NULL THEN
      SELECT COALESCE(MAX(n_reserved_jobs), 0) INTO v_reserved FROM batches WHERE batch_id = in_batch_id;
    END IF;
    IF v_reserved + in_n_new_jobs > in_max_jobs_per_batch THEN
      SET out_rc = 3,
          out_message = CONCAT('a batch may have at most ', FORMAT(in_max_jobs_per_batch, 0),
                               ' jobs (max_jobs_per_batch); this one would have ',
                               FORMAT(v_reserved + in_n_new_jobs, 0));
    END IF;
  END IF;
  IF out_rc = 0 AND (in_max_open_jobs_per_user IS NOT NULL OR v_user_quota IS NOT NULL) THEN
    SELECT COALESCE(SUM(IF(EXISTS (SELECT 1 FROM job_groups_cancelled c
                                   WHERE c.batch_id = b.batch_id AND c.job_group_id = 0),
                           b.n_jobs, b.n_reserved_jobs)
                        - (SELECT COALESCE(SUM(s.n_completed), 0) FROM job_groups_n_jobs_in_complete_states s
                           WHERE s.batch_id = b.batch_id AND s.job_group_id = 0)), 0)
      INTO v_open
      FROM batches b FORCE INDEX (batches_user_state)
      WHERE b.user = in_user AND b.state IN ('open', 'running');
    IF v_user_quota IS NOT NULL AND v_open + in_n_new_jobs > v_user_quota THEN
      SET out_rc = 7,
          out_message = CONCAT('user ', in_user, ' has ', FORMAT(v_open, 0), ' open jobs; ',
                               FORMAT(in_n_new_jobs, 0), ' more would pass the quota (max_ready_jobs) of user ',
                               in_user, ': ', FORMAT(v_user_quota, 0));
    ELSEIF v_open + in_n_new_jobs > in_max_open_jobs_per_user THEN
      SET out_rc = 7,
          out_message = CONCAT('user ', in_user, ' has ', FORMAT(v_open, 0), ' open jobs; ',
                               FORMAT(in_n_new_jobs, 0), ' more would pass the limit (max_open_jobs_per_user) of ',
                               FORMAT(in_max_open_jobs_per_user, 0));
    END IF;
  END IF;
  IF out_rc = 0 AND (in_max_open_jobs_per_project IS NOT NULL OR v_project_quota IS NOT NULL) THEN
    SELECT COALESCE(SUM(IF(EXISTS (SELECT 1 FROM job_groups_cancelled c
                                   WHERE c.batch_id = b.batch_id AND c.job_group_id = 0),
                           b.n_jobs, b.n_reserved_jobs)
                        - (SELECT COALESCE(SUM(s.n_completed), 0) FROM job_groups_n_jobs_in_complete_states s
                           WHERE s.batch_id = b.batch_id AND s.job_group_id = 0)), 0)
      INTO v_open
      FROM batches b FORCE INDEX (batches_billing_project_state)
      WHERE b.billing_project = in_billing_project AND b.state IN ('open', 'running');
    IF v_project_quota IS NOT NULL AND v_open + in_n_new_jobs > v_project_quota THEN
      SET out_rc = 7,
          out_message = CONCAT('billing project ', in_billing_project, ' has ', FORMAT(v_open, 0), ' open jobs; ',
                               FORMAT(in_n_new_jobs, 0), ' more would pass the quota (max_ready_jobs) of billing ',
                               'project ', in_billing_project, ': ', FORMAT(v_project_quota, 0));
    ELSEIF v_open + in_n_new_jobs > in_max_open_jobs_per_project THEN
      SET out_rc = 7,
          out_message = CONCAT('billing project ', in_billing_project, ' has ', FORMAT(v_open, 0), ' open jobs; ',
                               FORMAT(in_n_new_jobs, 0),
                               ' more would pass the limit (max_open_jobs_per_billing_project) of ',
                               FORMAT(in_max_open_jobs_per_project, 0));
    END IF;
  END IF;
END $$
DELIMITER ;
