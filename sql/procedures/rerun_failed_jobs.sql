-- RerunFailedJobs (design §9): a new update holding a copy of every
-- committed job of the batch that ended in one of in_states_bits (2 =
-- Failed, 4 = Error, 8 = Cancelled) and of every job depending on one of
-- them, transitively. A copy keeps its original's group, resources (cores,
-- memory, storage), on-demand choice, spec_ref, attributes and locks; an edge between two
-- re-run jobs joins their copies, an edge to a job that is not re-run
-- keeps pointing at the original (whose state is read under a shared lock,
-- as insert_jobs does, with its queued release: copies get ids above every
-- reserved one, so a final original whose children are still being
-- released counts as a pending parent of the copy, which the releaser will
-- reach).
-- Copies get ids in their originals' order, so every parent id stays
-- smaller than its child's. job_reruns records each copy's original; a job
-- already re-run is not re-run again (its copy is, if the copy fails).
--
-- One transaction reserves the update and inserts every copy, so a copy
-- set is all there or absent; the caller then runs commit_update.
-- Idempotent under (batch, token): a repeat returns the same update,
-- committed or not; a repeat with a different in_request_digest (other
-- states) is refused, rc 5 with the update's id (as create_update; a row or
-- call without a digest is matched on the token alone). Refused (rc 2) for a cancelled batch, a project that
-- is not open, or copies that would land in a cancelled group; refused as
-- create_update and insert_jobs refuse (rc 3 or 7) when the copies would
-- pass in_max_jobs_per_batch, the open jobs of the owner or project, or
-- give an original more than in_max_children_per_job children (each NULL
-- for none). With nothing to re-run the status row has update_id NULL and
-- nothing is written.
DROP PROCEDURE IF EXISTS rerun_failed_jobs;
DELIMITER $$
CREATE PROCEDURE rerun_failed_jobs(IN in_batch_id BIGINT, IN in_idempotency_token VARCHAR(100),
                                   IN in_request_digest CHAR(64),
                                   IN in_states_bits INT, IN in_now_ms BIGINT, IN in_max_jobs_per_batch INT,
                                   IN in_max_open_jobs_per_user BIGINT, IN in_max_open_jobs_per_project BIGINT,
                                   IN in_max_children_per_job INT)
proc: BEGIN
  DECLARE v_update_id INT;
  DECLARE v_digest CHAR(64);
  DECLARE v_over_limit VARCHAR(512);
  DECLARE v_start INT;
  DECLARE v_start_group INT;
  DECLARE v_n INT;
  DECLARE v_deleted BOOLEAN;
  DECLARE v_billing_project VARCHAR(100);
  DECLARE v_project_state VARCHAR(20);
  DECLARE v_group INT;
  DECLARE v_locked INT;
  DECLARE v_user VARCHAR(100);
  DECLARE v_rc INT;
  DECLARE v_message VARCHAR(1024);
  DECLARE v_fan_out VARCHAR(1024);
  DECLARE v_missing BOOLEAN DEFAULT FALSE;
  DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_missing = TRUE;
  DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;

  IF in_states_bits IS NULL OR in_states_bits < 2 OR in_states_bits > 14 OR (in_states_bits & 1) <> 0 THEN
    SELECT 3 AS rc, 'the states to re-run are a non-empty subset of Failed (2), Error (4), Cancelled (8)' AS message;
    LEAVE proc;
  END IF;
  IF in_idempotency_token IS NULL OR in_idempotency_token = '' THEN
    SELECT 3 AS rc, 'an idempotency token is required' AS message;
    LEAVE proc;
  END IF;
  -- seq numbers the originals in id order: copy id = start + seq - 1.
  DROP TEMPORARY TABLE IF EXISTS tmp_rerun;
  CREATE TEMPORARY TABLE tmp_rerun (
    seq INT NOT NULL AUTO_INCREMENT PRIMARY KEY,
    job_id INT NOT NULL UNIQUE,
    new_job_id INT NULL
  );
  -- The same mapping again: MySQL cannot open a temporary table twice in
  -- one statement, and the edges join a child's and a parent's copies.
  DROP TEMPORARY TABLE IF EXISTS tmp_rerun_parent;
  CREATE TEMPORARY TABLE tmp_rerun_parent (job_id INT NOT NULL PRIMARY KEY, new_job_id INT NOT NULL);
  -- The copies' edges, named as insert_jobs names its own: fan_out_check reads them.
  DROP TEMPORARY TABLE IF EXISTS tmp_new_edges;
  CREATE TEMPORARY TABLE tmp_new_edges (
    job_id INT NOT NULL,
    parent_id INT NOT NULL,
    accepted_states INT NOT NULL,
    parent_state VARCHAR(20) NULL,
    release_pending BOOLEAN NOT NULL DEFAULT FALSE,
    PRIMARY KEY (job_id, parent_id)
  );

  START TRANSACTION;
  -- Lock order as create_update: the billing project (shared; exclusive when
  -- its open jobs are counted) before the batch.
  SELECT billing_project INTO v_billing_project FROM batches WHERE batch_id = in_batch_id;
  IF in_max_open_jobs_per_project IS NULL THEN
    SELECT state INTO v_project_state FROM billing_projects WHERE name = v_billing_project LOCK IN SHARE MODE;
  ELSE
    SELECT state INTO v_project_state FROM billing_projects WHERE name = v_billing_project FOR UPDATE;
  END IF;
  SELECT deleted, user, n_reserved_job_groups + 1 INTO v_deleted, v_user, v_start_group
    FROM batches WHERE batch_id = in_batch_id FOR UPDATE;
  IF v_missing OR v_deleted THEN
    ROLLBACK;
    SELECT 1 AS rc, CONCAT('no batch ', in_batch_id) AS message;
    LEAVE proc;
  END IF;
  SELECT update_id, start_job_id, n_jobs, request_digest INTO v_update_id, v_start, v_n, v_digest
    FROM batch_updates WHERE batch_id = in_batch_id AND idempotency_token = in_idempotency_token;
  IF NOT v_missing AND v_digest <> in_request_digest THEN
    ROLLBACK;
    SELECT 5 AS rc, CONCAT('idempotency token "', in_idempotency_token, '" was used for update ', v_update_id,
                           ' of batch ', in_batch_id, ' with a different request') AS message,
           v_update_id AS update_id;
    LEAVE proc;
  END IF;
  IF NOT v_missing THEN
    COMMIT;
    SELECT 0 AS rc, 'exists' AS message, v_update_id AS update_id, v_start AS start_job_id, v_n AS n_jobs;
    LEAVE proc;
  END IF;
  SET v_missing = FALSE;
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

  -- The failed jobs not re-run yet, and every committed job below them.
  INSERT INTO tmp_rerun (job_id)
    WITH RECURSIVE rerun (job_id) AS (
      SELECT j.job_id FROM jobs j
      WHERE j.batch_id = in_batch_id AND j.state IN ('Failed', 'Error', 'Cancelled')
        AND (in_states_bits & CASE j.state WHEN 'Failed' THEN 2 WHEN 'Error' THEN 4 ELSE 8 END) <> 0
        AND NOT EXISTS (SELECT 1 FROM job_reruns r WHERE r.batch_id = in_batch_id AND r.rerun_of_job_id = j.job_id)
      UNION
      SELECT e.job_id FROM rerun
      JOIN job_parents e ON e.batch_id = in_batch_id AND e.parent_id = rerun.job_id
      JOIN jobs c ON c.batch_id = e.batch_id AND c.job_id = e.job_id
      JOIN batch_updates u ON u.batch_id = c.batch_id AND u.update_id = c.update_id AND u.committed
    )
    SELECT rerun.job_id FROM rerun
    WHERE NOT EXISTS (SELECT 1 FROM job_reruns r WHERE r.batch_id = in_batch_id AND r.rerun_of_job_id = rerun.job_id)
    ORDER BY rerun.job_id;
  SELECT COUNT(*) INTO v_n FROM tmp_rerun;
  IF v_n = 0 THEN
    ROLLBACK;
    SELECT 0 AS rc, 'nothing to re-run' AS message, NULL AS update_id, NULL AS start_job_id, 0 AS n_jobs;
    LEAVE proc;
  END IF;
  SELECT MIN(j.job_group_id) INTO v_group FROM tmp_rerun t
    JOIN jobs j ON j.batch_id = in_batch_id AND j.job_id = t.job_id
    WHERE EXISTS (SELECT 1 FROM job_groups_cancelled_self_or_ancestor x
                  WHERE x.batch_id = in_batch_id AND x.job_group_id = j.job_group_id);
  IF v_group IS NOT NULL THEN
    ROLLBACK;
    SELECT 2 AS rc, CONCAT('job group ', v_group, ' of batch ', in_batch_id, ' is cancelled') AS message;
    LEAVE proc;
  END IF;

  CALL job_limits_check(in_batch_id, v_user, v_billing_project, v_n, in_max_jobs_per_batch,
                        in_max_open_jobs_per_user, in_max_open_jobs_per_project, v_rc, v_message);
  IF v_rc <> 0 THEN
    ROLLBACK;
    SELECT v_rc AS rc, v_message AS message;
    LEAVE proc;
  END IF;

  -- Reserve the ids as create_update does.
  SELECT n_updates + 1, n_reserved_jobs + 1 INTO v_update_id, v_start FROM batches WHERE batch_id = in_batch_id;
  UPDATE batches SET n_updates = n_updates + 1, n_reserved_jobs = n_reserved_jobs + v_n
    WHERE batch_id = in_batch_id;
  INSERT INTO batch_updates (batch_id, update_id, idempotency_token, request_digest, start_job_id, n_jobs,
                             start_job_group_id, n_job_groups, time_created_ms)
    VALUES (in_batch_id, v_update_id, in_idempotency_token, in_request_digest, v_start, v_n, v_start_group, 0,
            in_now_ms);
  UPDATE tmp_rerun SET new_job_id = v_start + seq - 1;
  INSERT INTO tmp_rerun_parent (job_id, new_job_id) SELECT job_id, new_job_id FROM tmp_rerun;

  INSERT INTO tmp_new_edges (job_id, parent_id, accepted_states)
    SELECT t.new_job_id, COALESCE(p.new_job_id, e.parent_id), e.accepted_states
    FROM tmp_rerun t
    JOIN job_parents e ON e.batch_id = in_batch_id AND e.job_id = t.job_id
    LEFT JOIN tmp_rerun_parent p ON p.job_id = e.parent_id;
  -- Parents that are not re-run: lock them shared and read their state now.
  SELECT COUNT(*) INTO v_locked
    FROM tmp_new_edges e JOIN jobs p ON p.batch_id = in_batch_id AND p.job_id = e.parent_id
    WHERE e.parent_id < v_start
    LOCK IN SHARE MODE;
  UPDATE tmp_new_edges e JOIN jobs p ON p.batch_id = in_batch_id AND p.job_id = e.parent_id
    SET e.parent_state = p.state
    WHERE e.parent_id < v_start;
  SELECT COUNT(*) INTO v_locked
    FROM tmp_new_edges e
    JOIN job_child_releases r ON r.batch_id = in_batch_id AND r.parent_id = e.parent_id
    WHERE e.parent_id < v_start
    LOCK IN SHARE MODE;
  IF v_locked > 0 THEN
    UPDATE tmp_new_edges e
      JOIN job_child_releases r ON r.batch_id = in_batch_id AND r.parent_id = e.parent_id
      SET e.release_pending = TRUE
      WHERE e.parent_id < v_start AND e.job_id >= r.next_child_id;
  END IF;
  -- Fan-out: no original may get more than in_max_children_per_job children.
  CALL fan_out_check(in_batch_id, in_max_children_per_job, v_fan_out);
  IF v_fan_out IS NOT NULL THEN
    ROLLBACK;
    SELECT 3 AS rc, v_fan_out AS message;
    LEAVE proc;
  END IF;

  INSERT INTO jobs (batch_id, job_id, update_id, job_group_id, user, state, dependency_failed, always_run,
                    n_pending_parents, cores_mcpu, memory_bytes, storage_bytes, inst_coll, regions_bits, priority,
                    max_attempts, spec_ref, time_created_ms, timeout_ms, retry_policy, on_demand)
    SELECT in_batch_id, t.new_job_id, v_update_id, j.job_group_id, j.user, 'Pending', COALESCE(x.n_unaccepted > 0, FALSE),
           j.always_run, COALESCE(x.n_pending, 0), j.cores_mcpu, j.memory_bytes, j.storage_bytes, j.inst_coll,
           j.regions_bits, j.priority, j.max_attempts, j.spec_ref, in_now_ms, j.timeout_ms, j.retry_policy,
           -- On-demand if the original was (asked for, or moved there after preemptions).
           j.on_demand
    FROM tmp_rerun t
    JOIN jobs j ON j.batch_id = in_batch_id AND j.job_id = t.job_id
    LEFT JOIN (SELECT job_id,
                      SUM(parent_state IS NULL OR parent_state NOT IN ('Success', 'Failed', 'Error', 'Cancelled')
                          OR release_pending) AS n_pending,
                      SUM(COALESCE(parent_state IN ('Success', 'Failed', 'Error', 'Cancelled') AND NOT release_pending
                                   AND (accepted_states & CASE parent_state WHEN 'Success' THEN 1 WHEN 'Failed' THEN 2
                                                                            WHEN 'Error' THEN 4 ELSE 8 END) = 0,
                                   FALSE)) AS n_unaccepted
               FROM tmp_new_edges GROUP BY job_id) x ON x.job_id = t.new_job_id
    ORDER BY t.new_job_id;
  INSERT INTO job_parents (batch_id, job_id, parent_id, accepted_states)
    SELECT in_batch_id, job_id, parent_id, accepted_states FROM tmp_new_edges ORDER BY job_id, parent_id;
  INSERT INTO job_attributes (batch_id, job_id, `key`, `value`)
    SELECT in_batch_id, t.new_job_id, a.`key`, a.`value`
    FROM tmp_rerun t JOIN job_attributes a ON a.batch_id = in_batch_id AND a.job_id = t.job_id;
  INSERT INTO job_locks (batch_id, job_id, level, mode, lock_name)
    SELECT in_batch_id, t.new_job_id, l.level, l.mode, l.lock_name
    FROM tmp_rerun t JOIN job_locks l ON l.batch_id = in_batch_id AND l.job_id = t.job_id;
  INSERT INTO on_demand_jobs (batch_id, job_id, inst_coll)
    SELECT in_batch_id, t.new_job_id, j.inst_coll
    FROM tmp_rerun t JOIN jobs j ON j.batch_id = in_batch_id AND j.job_id = t.job_id
    WHERE j.on_demand ORDER BY t.new_job_id;
  INSERT INTO job_reruns (batch_id, job_id, rerun_of_job_id)
    SELECT in_batch_id, new_job_id, job_id FROM tmp_rerun ORDER BY new_job_id;
  COMMIT;
  DROP TEMPORARY TABLE IF EXISTS tmp_rerun;
  DROP TEMPORARY TABLE IF EXISTS tmp_rerun_parent;
  DROP TEMPORARY TABLE IF EXISTS tmp_new_edges;
  SELECT 0 AS rc, 'created' AS message, v_update_id AS update_id, v_start AS start_job_id, v_n AS n_jobs;
END $$
DELIMITER ;
