-- SJ, bulk: put Ready jobs on instances. in_jobs is a JSON array of
-- {"batch_id", "job_id", "attempt_id", "instance_name"} (attempt ids are
-- chosen by the driver); a row that names no instance goes on
-- in_instance_name. The driver makes one call per pool per cycle, its
-- placements on all the pool's instances together.
-- On an active instance a Ready job becomes Running under a new attempt; on
-- a pending (job-private, still booting) instance it becomes Creating, and a
-- later SJ with the same attempt id moves it to Running once the instance is
-- active. Jobs are taken in key order while their cores fit on their own
-- instance.
-- Per-job outcome: scheduled, creating, already_scheduled, not_found,
-- not_ready, cancelled (its group is cancelled or a dependency failed, and
-- it is not always_run), held (its group, an ancestor or the job is held:
-- migration 0029), over_budget, no_capacity; a scheduled job's row
-- also carries what a Run command needs (spec_ref, memory_bytes,
-- storage_bytes, timeout_ms, user, billing_project, trace_context,
-- budget_timeout_ms: the project's max_job_duration_ms where it has a
-- limit), NULLs for the others.
-- Budgets (migration 0013): a job of a billing project with a limit
-- reserves its worst-case cost (job_worst_case_micro_usd, for
-- job_reserve_ms), and is scheduled only while the project's spend +
-- reservations + this one stay within its limit (else over_budget). The
-- planner is handed the same cost by read_ready_heads.
-- A refused instance (unknown, inactive) refuses the whole call (the first
-- in name order is named); the driver then calls again per instance.
-- Counters and events of the state changes are written set-based by
-- record_job_changes, not by the jobs trigger (see jobs_after_update).
DROP PROCEDURE IF EXISTS schedule_jobs;
DELIMITER $$
CREATE PROCEDURE schedule_jobs(IN in_epoch BIGINT, IN in_instance_name VARCHAR(100),
                               IN in_jobs JSON, IN in_now_ms BIGINT)
proc: BEGIN
  DECLARE v_ok BOOLEAN;
  DECLARE v_locked INT;
  DECLARE v_instance VARCHAR(100);
  DECLARE v_instance_state VARCHAR(20);
  DECLARE v_room_mcpu BIGINT;
  DECLARE v_used_mcpu BIGINT DEFAULT 0;
  DECLARE v_done BOOLEAN DEFAULT FALSE;
  DECLARE v_batch_id BIGINT;
  DECLARE v_job_id INT;
  DECLARE v_cores INT;
  DECLARE v_project VARCHAR(100);
  DECLARE v_reserve BIGINT;
  DECLARE v_left DOUBLE;
  DECLARE v_cpu_rate DOUBLE;
  DECLARE v_memory_rate DOUBLE;
  DECLARE v_budgeted BOOLEAN DEFAULT FALSE;
  DECLARE candidates CURSOR FOR
    SELECT batch_id, job_id, instance_name, cores_mcpu, billing_project, reserve_micro_usd FROM tmp_schedule
    WHERE outcome = 'candidate' ORDER BY batch_id, job_id;
  DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_done = TRUE;
  DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN
    SET @corral_bulk_job_changes = NULL;
    ROLLBACK;
    RESIGNAL;
  END;

  IF in_jobs IS NULL OR JSON_TYPE(in_jobs) <> 'ARRAY' THEN
    SELECT 3 AS rc, 'jobs must be a JSON array' AS message;
    LEAVE proc;
  END IF;
  CALL create_change_tables();
  IF @@in_transaction = 0 AND @corral_scratch_schedule <=> 'fe1c20890310' THEN
    TRUNCATE TABLE tmp_schedule;
    TRUNCATE TABLE tmp_schedule_instances;
  ELSE
    SET @corral_scratch_schedule = NULL;
    DROP TEMPORARY TABLE IF EXISTS tmp_schedule;
    CREATE TEMPORARY TABLE tmp_schedule (
      batch_id BIGINT NOT NULL,
      job_id INT NOT NULL,
      attempt_id VARCHAR(40) NULL,
      instance_name VARCHAR(100) NULL,
      found BOOLEAN NOT NULL DEFAULT FALSE,
      old_state VARCHAR(20) NULL,
      old_attempt_id VARCHAR(40) NULL,
      always_run BOOLEAN NULL,
      dependency_failed BOOLEAN NULL,
      job_group_id INT NULL,
      inst_coll VARCHAR(100) NULL,
      cores_mcpu INT NULL,
      memory_bytes BIGINT NULL,
      storage_bytes BIGINT NULL,
      billing_project VARCHAR(100) NULL,
      reserve_ms BIGINT NULL,
      reserve_micro_usd BIGINT NOT NULL DEFAULT 0,
      group_cancelled BOOLEAN NOT NULL DEFAULT FALSE,
      held BOOLEAN NOT NULL DEFAULT FALSE,
      outcome VARCHAR(32) NULL,
      PRIMARY KEY (batch_id, job_id)
    );
    DROP TEMPORARY TABLE IF EXISTS tmp_schedule_instances;
    CREATE TEMPORARY TABLE tmp_schedule_instances (
      name VARCHAR(100) NOT NULL PRIMARY KEY,
      state VARCHAR(20) NULL,
      free_mcpu BIGINT NOT NULL DEFAULT 0,
      candidates_mcpu BIGINT NOT NULL DEFAULT 0,
      used_mcpu BIGINT NOT NULL DEFAULT 0
    );
    SET @corral_scratch_schedule = 'fe1c20890310';
  END IF;
  INSERT INTO tmp_schedule (batch_id, job_id, attempt_id, instance_name)
    SELECT jt.batch_id, jt.job_id, jt.attempt_id, COALESCE(jt.instance_name, in_instance_name)
    FROM JSON_TABLE(in_jobs, '$[*]' COLUMNS (batch_id BIGINT PATH '$.batch_id', job_id INT PATH '$.job_id',
                                              attempt_id VARCHAR(40) PATH '$.attempt_id',
                                              instance_name VARCHAR(100) PATH '$.instance_name')) jt
  ON DUPLICATE KEY UPDATE batch_id = tmp_schedule.batch_id;
  IF EXISTS (SELECT 1 FROM tmp_schedule WHERE attempt_id IS NULL OR attempt_id = '') THEN
    SELECT 3 AS rc, 'every job needs an attempt_id' AS message;
    LEAVE proc;
  END IF;
  IF EXISTS (SELECT 1 FROM tmp_schedule WHERE instance_name IS NULL OR instance_name = '') THEN
    SELECT 3 AS rc, 'every job needs an instance_name' AS message;
    LEAVE proc;
  END IF;
  INSERT INTO tmp_schedule_instances (name) SELECT DISTINCT instance_name FROM tmp_schedule;

  START TRANSACTION;
  CALL check_epoch(in_epoch, v_ok);
  IF NOT v_ok THEN
    ROLLBACK;
    SELECT 4 AS rc, 'stale leader epoch' AS message;
    LEAVE proc;
  END IF;

  SELECT COUNT(*) INTO v_locked
    FROM tmp_schedule t JOIN jobs j ON j.batch_id = t.batch_id AND j.job_id = t.job_id
    FOR UPDATE;
  UPDATE tmp_schedule t
    JOIN jobs j ON j.batch_id = t.batch_id AND j.job_id = t.job_id
    SET t.found = TRUE, t.old_state = j.state, t.old_attempt_id = j.attempt_id, t.always_run = j.always_run,
        t.dependency_failed = j.dependency_failed, t.job_group_id = j.job_group_id, t.inst_coll = j.inst_coll,
        t.cores_mcpu = j.cores_mcpu, t.memory_bytes = COALESCE(j.memory_bytes, 0), t.storage_bytes = j.storage_bytes,
        -- Read by a subquery, which takes no locks: joined here, the batch rows were share-locked and
        -- deadlocked with the MJCs that update them.
        t.reserve_ms = (SELECT job_reserve_ms(j.timeout_ms, p.max_job_duration_ms)
                        FROM batches b JOIN billing_projects p ON p.name = b.billing_project
                        WHERE b.batch_id = t.batch_id AND p.limit_usd IS NOT NULL);
  -- Only a call with jobs of a limited project pays for pricing and budgets.
  SET v_budgeted = EXISTS (SELECT 1 FROM tmp_schedule WHERE reserve_ms IS NOT NULL);
  IF v_budgeted THEN
    SELECT cpu_rate_usd, memory_rate_usd INTO v_cpu_rate, v_memory_rate FROM reservation_rates;
    UPDATE tmp_schedule t
      SET t.billing_project = (SELECT b.billing_project FROM batches b WHERE b.batch_id = t.batch_id),
          t.reserve_micro_usd = job_worst_case_micro_usd(t.cores_mcpu, t.memory_bytes, t.reserve_ms,
                                                         v_cpu_rate, v_memory_rate)
      WHERE t.reserve_ms IS NOT NULL;
  END IF;
  UPDATE tmp_schedule t
    SET t.group_cancelled = EXISTS (SELECT 1 FROM job_groups_cancelled_self_or_ancestor x
                                    WHERE x.batch_id = t.batch_id AND x.job_group_id = t.job_group_id),
        t.held = EXISTS (SELECT 1 FROM job_groups_held_self_or_ancestor y
                         WHERE y.batch_id = t.batch_id AND y.job_group_id = t.job_group_id)
                 OR EXISTS (SELECT 1 FROM jobs_held h WHERE h.batch_id = t.batch_id AND h.job_id = t.job_id);

  -- The instances, locked in name order (the scratch table's key leads the
  -- join, so only their rows are touched), then read by subqueries, which
  -- take no locks: joined in an UPDATE, every instance row the join read
  -- was share-locked, and concurrent SJs and MJCs deadlocked.
  SELECT COUNT(*) INTO v_locked
    FROM tmp_schedule_instances s STRAIGHT_JOIN instances i ON i.name = s.name FOR UPDATE;
  UPDATE tmp_schedule_instances s
    SET s.state = (SELECT i.state FROM instances i WHERE i.name = s.name),
        s.free_mcpu = COALESCE((SELECT i.free_cores_mcpu FROM instances i WHERE i.name = s.name), 0);
  SET v_done = FALSE;
  SELECT name, state INTO v_instance, v_instance_state FROM tmp_schedule_instances
    WHERE state IS NULL OR state NOT IN ('pending', 'active') ORDER BY name LIMIT 1;
  IF NOT v_done THEN
    ROLLBACK;
    IF v_instance_state IS NULL THEN
      SELECT 1 AS rc, CONCAT('no instance ', v_instance) AS message;
    ELSE
      SELECT 2 AS rc, CONCAT('instance ', v_instance, ' is ', v_instance_state) AS message;
    END IF;
    LEAVE proc;
  END IF;
  SET v_done = FALSE;

  UPDATE tmp_schedule t JOIN tmp_schedule_instances s ON s.name = t.instance_name SET t.outcome = CASE
      WHEN NOT t.found THEN 'not_found'
      WHEN t.old_state = 'Running' AND t.old_attempt_id = t.attempt_id THEN 'already_scheduled'
      WHEN t.old_state = 'Creating' AND t.old_attempt_id = t.attempt_id AND s.state = 'pending' THEN 'already_scheduled'
      WHEN t.old_state = 'Creating' AND t.old_attempt_id = t.attempt_id THEN 'start_created'
      WHEN t.old_state <> 'Ready' THEN 'not_ready'
      WHEN NOT t.always_run AND (t.dependency_failed OR t.group_cancelled) THEN 'cancelled'
      WHEN t.held THEN 'held'
      ELSE 'candidate' END;

  -- What each limited project has left: its limit less its spend and what
  -- open attempts reserved, read with the project's row locked.
  IF v_budgeted THEN
    DROP TEMPORARY TABLE IF EXISTS tmp_budget;
    CREATE TEMPORARY TABLE tmp_budget (billing_project VARCHAR(100) NOT NULL PRIMARY KEY,
                                       left_micro_usd DOUBLE NOT NULL);
    SELECT COUNT(*) INTO v_locked FROM billing_projects
      WHERE limit_usd IS NOT NULL
        AND name IN (SELECT billing_project FROM tmp_schedule WHERE outcome = 'candidate' AND reserve_micro_usd > 0)
      FOR UPDATE;
    INSERT INTO tmp_budget (billing_project, left_micro_usd)
      SELECT p.name,
             p.limit_usd * 1000000
             - COALESCE((SELECT SUM(x.`usage` * r.rate_usd) FROM aggregated_billing_project_resources x
                         JOIN resources r ON r.resource_id = x.resource_id WHERE x.billing_project = p.name), 0) * 1000000
             - COALESCE((SELECT SUM(v.reserved_micro_usd) FROM aggregated_billing_project_reservations v
                         WHERE v.billing_project = p.name), 0)
      FROM billing_projects p
      WHERE p.limit_usd IS NOT NULL
        AND p.name IN (SELECT billing_project FROM tmp_schedule WHERE outcome = 'candidate' AND reserve_micro_usd > 0);
  END IF;

  -- Fit new attempts into the budgets and their instances' free cores, in
  -- key order. Without budgets, when every instance's candidates fit on it
  -- (the driver asks for what it saw free), the loop would take every one:
  -- one statement does.
  UPDATE tmp_schedule_instances s
    SET s.candidates_mcpu = (SELECT COALESCE(SUM(t.cores_mcpu), 0) FROM tmp_schedule t
                             WHERE t.instance_name = s.name AND t.outcome = 'candidate');
  IF NOT v_budgeted AND NOT EXISTS (SELECT 1 FROM tmp_schedule_instances WHERE candidates_mcpu > free_mcpu) THEN
    UPDATE tmp_schedule t JOIN tmp_schedule_instances s ON s.name = t.instance_name
      SET t.outcome = IF(s.state = 'active', 'scheduled', 'creating')
      WHERE t.outcome = 'candidate';
  ELSE
    OPEN candidates;
    fit: LOOP
      FETCH candidates INTO v_batch_id, v_job_id, v_instance, v_cores, v_project, v_reserve;
      IF v_done THEN LEAVE fit; END IF;
      IF v_reserve > 0 THEN
        SELECT COALESCE(MAX(left_micro_usd), 0) INTO v_left FROM tmp_budget WHERE billing_project = v_project;
        IF v_left < v_reserve THEN
          UPDATE tmp_schedule SET outcome = 'over_budget' WHERE batch_id = v_batch_id AND job_id = v_job_id;
          ITERATE fit;
        END IF;
      END IF;
      SELECT free_mcpu - used_mcpu, state INTO v_room_mcpu, v_instance_state
        FROM tmp_schedule_instances WHERE name = v_instance;
      IF v_cores <= v_room_mcpu THEN
        IF v_reserve > 0 THEN
          UPDATE tmp_budget SET left_micro_usd = left_micro_usd - v_reserve WHERE billing_project = v_project;
        END IF;
        UPDATE tmp_schedule_instances SET used_mcpu = used_mcpu + v_cores WHERE name = v_instance;
        UPDATE tmp_schedule SET outcome = IF(v_instance_state = 'active', 'scheduled', 'creating')
          WHERE batch_id = v_batch_id AND job_id = v_job_id;
      ELSE
        UPDATE tmp_schedule SET outcome = 'no_capacity' WHERE batch_id = v_batch_id AND job_id = v_job_id;
      END IF;
    END LOOP;
    CLOSE candidates;
  END IF;
  SELECT COALESCE(SUM(cores_mcpu), 0) INTO v_used_mcpu FROM tmp_schedule WHERE outcome IN ('scheduled', 'creating');

  INSERT INTO attempts (batch_id, job_id, attempt_id, instance_name, reserved_micro_usd, reserved_ms)
    SELECT batch_id, job_id, attempt_id, instance_name, reserve_micro_usd, reserve_ms
    FROM tmp_schedule WHERE outcome IN ('scheduled', 'creating') ORDER BY batch_id, job_id;
  SET @corral_bulk_job_changes = TRUE;
  UPDATE jobs j
    JOIN tmp_schedule t ON t.batch_id = j.batch_id AND t.job_id = j.job_id
    SET j.state = IF(t.outcome = 'creating', 'Creating', 'Running'),
        j.attempt_id = t.attempt_id,
        j.n_attempts = j.n_attempts + IF(t.outcome = 'start_created', 0, 1)
    WHERE t.outcome IN ('scheduled', 'creating', 'start_created');
  SET @corral_bulk_job_changes = NULL;
  IF v_used_mcpu > 0 THEN
    -- The started jobs' cores, memory and storage (instances.used_*, migration 0018).
    UPDATE (SELECT instance_name, SUM(cores_mcpu) AS cores_mcpu, SUM(memory_bytes) AS memory_bytes,
                   SUM(storage_bytes) AS storage_bytes
            FROM tmp_schedule WHERE outcome IN ('scheduled', 'creating') GROUP BY instance_name) u
      STRAIGHT_JOIN instances i ON i.name = u.instance_name
      SET i.free_cores_mcpu = i.free_cores_mcpu - u.cores_mcpu,
          i.used_memory_bytes = i.used_memory_bytes + u.memory_bytes,
          i.used_storage_bytes = i.used_storage_bytes + u.storage_bytes;
  END IF;
  -- Counters and events last (lock order: token rows after the instance).
  INSERT INTO tmp_job_changes (batch_id, job_id, job_group_id, inst_coll, cores_mcpu, always_run,
                               old_state, new_state, old_dependency_failed, new_dependency_failed, attempt_id)
    SELECT batch_id, job_id, job_group_id, inst_coll, cores_mcpu, always_run,
           old_state, IF(outcome = 'creating', 'Creating', 'Running'), dependency_failed, dependency_failed, attempt_id
    FROM tmp_schedule
    WHERE outcome IN ('scheduled', 'creating', 'start_created')
    ORDER BY batch_id, job_id;
  CALL record_job_changes();
  IF v_budgeted THEN
    INSERT INTO aggregated_billing_project_reservations (billing_project, token, reserved_micro_usd)
      SELECT billing_project, FLOOR(RAND() * 64), SUM(reserve_micro_usd)
      FROM tmp_schedule WHERE outcome IN ('scheduled', 'creating') AND reserve_micro_usd > 0
      GROUP BY billing_project ORDER BY billing_project
    ON DUPLICATE KEY UPDATE reserved_micro_usd = reserved_micro_usd + VALUES(reserved_micro_usd);
  END IF;
  COMMIT;

  -- With what the driver's Run command needs of a scheduled job, so that it need not read it again.
  SELECT t.batch_id, t.job_id, t.attempt_id, t.instance_name,
         IF(t.outcome = 'start_created', 'scheduled', t.outcome) AS outcome,
         j.spec_ref, j.memory_bytes, j.storage_bytes, j.timeout_ms, b.user, b.billing_project, u.trace_context,
         IF(p.limit_usd IS NULL, NULL, p.max_job_duration_ms) AS budget_timeout_ms
    FROM tmp_schedule t
    LEFT JOIN jobs j ON j.batch_id = t.batch_id AND j.job_id = t.job_id
      AND t.outcome IN ('scheduled', 'start_created')
    LEFT JOIN batches b ON b.batch_id = j.batch_id
    LEFT JOIN billing_projects p ON p.name = b.billing_project
    LEFT JOIN batch_updates u ON u.batch_id = j.batch_id AND u.update_id = j.update_id
    ORDER BY t.batch_id, t.job_id;
  SELECT 0 AS rc, 'ok' AS message, v_used_mcpu AS scheduled_cores_mcpu;
  IF v_budgeted THEN
    DROP TEMPORARY TABLE IF EXISTS tmp_budget;
  END IF;
END $$
DELIMITER ;
