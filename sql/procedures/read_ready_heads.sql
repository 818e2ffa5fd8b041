-- The heads of the users' queues: for each (pool, user, depth) of in_looks
-- ([[pool, user, depth], ...], from the planner's depths), the first
-- `depth` Ready jobs of that user in that pool that may run now, in queue
-- order (priority, highest first, then batch and job). The scheduler and
-- ExplainJob read their candidates with it (services/db/plan_snapshot.py).
--
-- Each head is one walk of the jobs_ready_queue index (migration 0019)
-- that stops after `depth` jobs, so a cycle costs the same whether a user
-- has ten Ready jobs or a million. A job may run unless it is cancelled
-- (its group or an ancestor is) or a parent failed it, and a job that
-- always runs may run anyway; the cancelled groups of running batches are
-- gathered once per call, so each step of a walk decides from the index
-- and one lookup, and a head is never cut short by jobs the cancellers have
-- not drained yet.
--
-- A held job (migration 0029: its group or an ancestor is held, or the
-- job itself) is passed over as a cancelled one is: it stays Ready, and
-- the walk goes on past it. Its hold is gathered once per call too.
--
-- Each candidate carries reserve_micro_usd: what schedule_jobs would
-- reserve for it (job_worst_case_micro_usd at the reservation rates read
-- now), 0 when its billing project has no limit. The planner takes it as
-- it is and prices nothing itself.
--
-- Each carries its image as its spec names it (NULL: not recorded), so the
-- planner may prefer a worker whose cache holds it.
--
-- Returns the candidates' rows, then the status row. Reads only, each
-- statement at READ COMMITTED (the services' sessions): no lock is taken.
DROP PROCEDURE IF EXISTS read_ready_heads;
DELIMITER $$
CREATE PROCEDURE read_ready_heads(IN in_looks JSON)
proc: BEGIN
  DECLARE v_done BOOLEAN DEFAULT FALSE;
  DECLARE v_pool VARCHAR(100);
  DECLARE v_user VARCHAR(100);
  DECLARE v_depth INT;
  DECLARE v_any_cancelled BOOLEAN;
  DECLARE v_any_held BOOLEAN;
  DECLARE v_cpu_rate DOUBLE;
  DECLARE v_memory_rate DOUBLE;
  DECLARE looks CURSOR FOR
    SELECT pool, usr, depth
    FROM JSON_TABLE(in_looks, '$[*]' COLUMNS (pool VARCHAR(100) PATH '$[0]', usr VARCHAR(100) PATH '$[1]',
                                              depth INT PATH '$[2]')) t
    WHERE depth > 0;
  DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_done = TRUE;

  IF in_looks IS NULL OR JSON_TYPE(in_looks) <> 'ARRAY' THEN
    SELECT 3 AS rc, 'looks must be a JSON array of [pool, user, depth]' AS message;
    LEAVE proc;
  END IF;

  -- MEMORY tables, made once per connection and emptied with DELETE, which
  -- frees a MEMORY table's rows (InnoDB's would stay, unpurged) and, unlike
  -- TRUNCATE, does not commit the snapshot this read runs in. Dropping them
  -- on every call made the connection parse its routines again on the next
  -- (see create_completion_tables).
  IF @corral_scratch_ready_heads <=> '09b15a34681d' THEN
    DELETE FROM tmp_cancelled_groups;
    DELETE FROM tmp_held_groups;
    DELETE FROM tmp_ready_heads;
  ELSE
    SET @corral_scratch_ready_heads = NULL;
    DROP TEMPORARY TABLE IF EXISTS tmp_cancelled_groups;
    CREATE TEMPORARY TABLE tmp_cancelled_groups (
      batch_id BIGINT NOT NULL,
      job_group_id INT NOT NULL,
      PRIMARY KEY (batch_id, job_group_id)
    ) ENGINE=MEMORY;
    DROP TEMPORARY TABLE IF EXISTS tmp_held_groups;
    CREATE TEMPORARY TABLE tmp_held_groups (
      batch_id BIGINT NOT NULL,
      job_group_id INT NOT NULL,
      PRIMARY KEY (batch_id, job_group_id)
    ) ENGINE=MEMORY;
    DROP TEMPORARY TABLE IF EXISTS tmp_ready_heads;
    CREATE TEMPORARY TABLE tmp_ready_heads (
      batch_id BIGINT NOT NULL,
      job_id INT NOT NULL
    ) ENGINE=MEMORY;
    SET @corral_scratch_ready_heads = '09b15a34681d';
  END IF;

  -- Every group of a running batch that is cancelled, itself or through an
  -- ancestor (a Ready job's batch is running).
  INSERT IGNORE INTO tmp_cancelled_groups (batch_id, job_group_id)
    SELECT x.batch_id, x.job_group_id
    FROM job_groups_cancelled_self_or_ancestor x
    JOIN batches b ON b.batch_id = x.batch_id AND b.state = 'running';
  SET v_any_cancelled = EXISTS (SELECT 1 FROM tmp_cancelled_groups);
  -- Every group of a running batch that is held, itself or through an
  -- ancestor; and whether any job is held one by one (only jobs of running
  -- batches are: check_completions drops a batch's at its completion).
  INSERT IGNORE INTO tmp_held_groups (batch_id, job_group_id)
    SELECT y.batch_id, y.job_group_id
    FROM job_groups_held_self_or_ancestor y
    JOIN batches b ON b.batch_id = y.batch_id AND b.state = 'running';
  SET v_any_held = EXISTS (SELECT 1 FROM tmp_held_groups) OR EXISTS (SELECT 1 FROM jobs_held);

  OPEN looks;
  heads: LOOP
    FETCH looks INTO v_pool, v_user, v_depth;
    IF v_done THEN
      LEAVE heads;
    END IF;
    IF v_any_held THEN
      INSERT INTO tmp_ready_heads (batch_id, job_id)
        SELECT j.batch_id, j.job_id
        FROM jobs j FORCE INDEX (jobs_ready_queue)
        LEFT JOIN tmp_cancelled_groups g ON g.batch_id = j.batch_id AND g.job_group_id = j.job_group_id
        LEFT JOIN tmp_held_groups hg ON hg.batch_id = j.batch_id AND hg.job_group_id = j.job_group_id
        LEFT JOIN jobs_held hj ON hj.batch_id = j.batch_id AND hj.job_id = j.job_id
        WHERE j.state = 'Ready' AND j.inst_coll = v_pool AND j.user = v_user
          AND (j.always_run OR (NOT j.dependency_failed AND g.batch_id IS NULL))
          AND hg.batch_id IS NULL AND hj.batch_id IS NULL
        ORDER BY j.priority DESC, j.batch_id, j.job_id
        LIMIT v_depth;
    ELSEIF v_any_cancelled THEN
      -- The same without the holds' joins: nothing is held.
      INSERT INTO tmp_ready_heads (batch_id, job_id)
        SELECT j.batch_id, j.job_id
        FROM jobs j FORCE INDEX (jobs_ready_queue)
        LEFT JOIN tmp_cancelled_groups g ON g.batch_id = j.batch_id AND g.job_group_id = j.job_group_id
        WHERE j.state = 'Ready' AND j.inst_coll = v_pool AND j.user = v_user
          AND (j.always_run OR (NOT j.dependency_failed AND g.batch_id IS NULL))
        ORDER BY j.priority DESC, j.batch_id, j.job_id
        LIMIT v_depth;
    ELSE
      -- The same without the join: nothing is held, and no group of a running batch is cancelled.
      INSERT INTO tmp_ready_heads (batch_id, job_id)
        SELECT j.batch_id, j.job_id
        FROM jobs j FORCE INDEX (jobs_ready_queue)
        WHERE j.state = 'Ready' AND j.inst_coll = v_pool AND j.user = v_user
          AND (j.always_run OR NOT j.dependency_failed)
        ORDER BY j.priority DESC, j.batch_id, j.job_id
        LIMIT v_depth;
    END IF;
  END LOOP;
  CLOSE looks;

  SELECT cpu_rate_usd, memory_rate_usd INTO v_cpu_rate, v_memory_rate FROM reservation_rates;
  SELECT j.user, j.inst_coll, j.batch_id, j.job_id, j.cores_mcpu, j.memory_bytes, j.storage_bytes, j.regions_bits,
         j.priority, j.time_created_ms, b.billing_project, j.on_demand, j.avoid_instance, j.not_before_ms,
         j.timeout_ms, j.image,
         IF(p.limit_usd IS NULL, 0,
            job_worst_case_micro_usd(j.cores_mcpu, j.memory_bytes, job_reserve_ms(j.timeout_ms, p.max_job_duration_ms),
                                     v_cpu_rate, v_memory_rate)) AS reserve_micro_usd,
         -- Its locks as [[level, mode, name], ...], NULL if it declares none: read here, by the primary key,
         -- rather than by a second statement naming every candidate.
         (SELECT JSON_ARRAYAGG(JSON_ARRAY(l.level, l.mode, l.lock_name)) FROM job_locks l
          WHERE l.batch_id = j.batch_id AND l.job_id = j.job_id) AS locks
  -- In this order: the few heads first, each a lookup by primary key.
  FROM tmp_ready_heads h
  STRAIGHT_JOIN jobs j ON j.batch_id = h.batch_id AND j.job_id = h.job_id AND j.state = 'Ready'
  STRAIGHT_JOIN batches b ON b.batch_id = j.batch_id
  STRAIGHT_JOIN billing_projects p ON p.name = b.billing_project
  ORDER BY j.priority DESC, j.batch_id, j.job_id;
  SELECT 0 AS rc;
END $$
DELIMITER ;
