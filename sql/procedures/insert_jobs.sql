-- Adds a bunch of jobs to an uncommitted update. Several clients may insert
-- bunches of one update in parallel: ids come from the update's reserved
-- block, so bunches never contend. in_jobs is a JSON array of
--   {"job_id", "job_group_id", "always_run", "cores_mcpu", "memory_bytes",
--    "storage_bytes" (migration 0017), "inst_coll", "regions": ["name", ...], "priority", "max_attempts",
--    "spec_ref", "timeout_ms" (none: no timeout), "parents": [{"job_id": N} | {"in_update_offset": -k},
--    "accepted_states": bits], "attributes": [{"key", "value"}],
--    "locks": [{"level", "mode", "name"}], "retry_policy": "{...}" (migration 0014, the policy's
--    JSON as a string; none: the nearest group's), "on_demand": true (only machines that are not preemptible)}
-- Only job_id, cores_mcpu and inst_coll are required; a key left out takes
-- its default (group 0, false, 0, max_attempts 3, none, an empty list).
-- Every job is read in one pass; the lists (regions, parents, attributes,
-- locks) are read again only when a job of the bunch has one.
-- A relative parent (negative offset) resolves to job_id + offset and must
-- lie in the same update; an absolute parent below the update must be a
-- committed job. Its current state is read under a shared lock, so a parent
-- completing concurrently is counted exactly once (here or by its MJC). A
-- final parent whose children are still being released (its
-- job_child_releases row, also share-locked) counts as pending for a job
-- the release has not reached yet (job_id >= next_child_id): the releaser
-- will count it down.
-- With in_max_children_per_job set, a bunch that would give a job more
-- children than that is refused (rc 3); bunches inserted concurrently see
-- each other's edges only once committed, so together they may pass it by
-- up to their own edges.
-- Nothing is written unless the whole bunch is valid; a re-sent bunch
-- returns 'duplicate'.
DROP PROCEDURE IF EXISTS insert_jobs;
DELIMITER $$
CREATE PROCEDURE insert_jobs(IN in_batch_id BIGINT, IN in_update_id INT, IN in_jobs JSON, IN in_now_ms BIGINT,
                             IN in_max_children_per_job INT)
proc: BEGIN
  DECLARE v_start INT;
  DECLARE v_n INT;
  DECLARE v_committed BOOLEAN;
  DECLARE v_count INT;
  DECLARE v_distinct INT;
  DECLARE v_bad INT;
  DECLARE v_locked INT;
  DECLARE v_user VARCHAR(100);
  DECLARE v_fan_out VARCHAR(1024);
  DECLARE v_has_regions BOOLEAN;
  DECLARE v_has_parents BOOLEAN;
  DECLARE v_has_attributes BOOLEAN;
  DECLARE v_has_locks BOOLEAN;
  DECLARE v_missing BOOLEAN DEFAULT FALSE;
  DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_missing = TRUE;
  DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;
  -- 1062 (duplicate key): a bunch sent concurrently committed some of these
  -- jobs first (both saw none of them before inserting); answer as for a
  -- bunch sent after it. The ids are read from in_jobs again: tmp_new_jobs
  -- was filled inside the transaction, so the rollback emptied it.
  DECLARE EXIT HANDLER FOR 1062
  BEGIN
    ROLLBACK;
    SELECT COUNT(*), COUNT(j.job_id) INTO v_count, v_bad
      FROM JSON_TABLE(in_jobs, '$[*]' COLUMNS (job_id INT PATH '$.job_id')) t
      LEFT JOIN jobs j ON j.batch_id = in_batch_id AND j.job_id = t.job_id;
    IF v_bad = 0 THEN
      RESIGNAL;  -- not a job of this bunch: not a bunch sent twice
    END IF;
    SELECT IF(v_bad = v_count, 0, 5) AS rc,
           IF(v_bad = v_count, 'duplicate', 'some jobs of this bunch were inserted before, others not') AS message;
  END;

  IF in_jobs IS NULL OR JSON_TYPE(in_jobs) <> 'ARRAY' THEN
    SELECT 3 AS rc, 'jobs must be a JSON array' AS message;
    LEAVE proc;
  END IF;
  -- Dropped and made again on every call, unlike the driver's scratch tables
  -- (create_completion_tables): the drop makes the connection parse this
  -- routine again on its next call, and kept, the fan-out check
  -- (fan_out_check) failed on its second run from the routine cache
  -- (MariaDB 10.11: "Unknown column 'x.parent_id'" in its nested derived
  -- table).
  DROP TEMPORARY TABLE IF EXISTS tmp_new_jobs;
  -- Not unique: a job id given twice is counted below and refused.
  CREATE TEMPORARY TABLE tmp_new_jobs (
    job_id INT NOT NULL,
    job_group_id INT NOT NULL,
    always_run BOOLEAN NOT NULL,
    cores_mcpu INT NULL,
    memory_bytes BIGINT NOT NULL,
    storage_bytes BIGINT NOT NULL,
    inst_coll VARCHAR(100) NULL,
    regions_bits BIGINT NULL,
    priority INT NOT NULL,
    max_attempts INT NOT NULL,
    spec_ref VARCHAR(1024) NULL,
    timeout_ms BIGINT NULL,
    retry_policy TEXT NULL,
    on_demand BOOLEAN NOT NULL DEFAULT FALSE,
    image VARCHAR(255) NULL,
    n_pending_parents INT NOT NULL DEFAULT 0,
    dependency_failed BOOLEAN NOT NULL DEFAULT FALSE,
    -- Whether the job's regions, parents, attributes, locks (each path as
    -- the nested passes below read it) hold anything: a pass that no job
    -- of the bunch needs does not parse the bunch again.
    has_regions BOOLEAN NOT NULL,
    has_parents BOOLEAN NOT NULL,
    has_attributes BOOLEAN NOT NULL,
    has_locks BOOLEAN NOT NULL,
    KEY (job_id)
  );
  -- The bunch's edges (fan_out_check reads them).
  DROP TEMPORARY TABLE IF EXISTS tmp_new_edges;
  CREATE TEMPORARY TABLE tmp_new_edges (
    job_id INT NOT NULL,
    parent_id INT NOT NULL,
    accepted_states INT NOT NULL,
    parent_state VARCHAR(20) NULL,
    parent_committed BOOLEAN NULL,
    -- the parent is final but its release has not reached this job yet
    release_pending BOOLEAN NOT NULL DEFAULT FALSE,
    PRIMARY KEY (job_id, parent_id)
  );

  START TRANSACTION;
  -- Lock order: the batch (shared) before its update row, as commit_update
  -- takes them exclusively in that order.
  -- The owner is copied onto each job (jobs.user: the scheduler's queue index).
  SELECT COUNT(*), MAX(user) INTO v_count, v_user FROM batches WHERE batch_id = in_batch_id LOCK IN SHARE MODE;
  -- Shared lock: commit_update takes it exclusively, so no bunch lands in a
  -- committed update.
  SELECT start_job_id, n_jobs, committed INTO v_start, v_n, v_committed
    FROM batch_updates WHERE batch_id = in_batch_id AND update_id = in_update_id LOCK IN SHARE MODE;
  IF v_missing THEN
    ROLLBACK;
    SELECT 1 AS rc, CONCAT('no update ', in_update_id, ' of batch ', in_batch_id) AS message;
    LEAVE proc;
  END IF;

  -- The one pass over the bunch that every call makes.
  INSERT INTO tmp_new_jobs (job_id, job_group_id, always_run, cores_mcpu, memory_bytes, storage_bytes, inst_coll,
                            priority, max_attempts, spec_ref, timeout_ms, retry_policy, on_demand, image,
                            has_regions, has_parents, has_attributes, has_locks)
    SELECT jt.job_id, COALESCE(jt.job_group_id, 0), COALESCE(jt.always_run, FALSE), jt.cores_mcpu,
           COALESCE(jt.memory_bytes, 0), COALESCE(jt.storage_bytes, 0), jt.inst_coll, COALESCE(jt.priority, 0), COALESCE(jt.max_attempts, 3),
           jt.spec_ref, jt.timeout_ms, jt.retry_policy, COALESCE(jt.on_demand, FALSE), jt.image,
           jt.has_regions, jt.has_parents, jt.has_attributes, jt.has_locks
    FROM JSON_TABLE(in_jobs, '$[*]' COLUMNS (
      job_id INT PATH '$.job_id',
      job_group_id INT PATH '$.job_group_id',
      always_run BOOLEAN PATH '$.always_run',
      cores_mcpu INT PATH '$.cores_mcpu',
      memory_bytes BIGINT PATH '$.memory_bytes',
      storage_bytes BIGINT PATH '$.storage_bytes',
      inst_coll VARCHAR(100) PATH '$.inst_coll',
      priority INT PATH '$.priority',
      max_attempts INT PATH '$.max_attempts',
      spec_ref VARCHAR(1024) PATH '$.spec_ref',
      timeout_ms BIGINT PATH '$.timeout_ms',
      retry_policy TEXT PATH '$.retry_policy',
      on_demand BOOLEAN PATH '$.on_demand',
      image VARCHAR(255) PATH '$.image',
      has_regions BOOLEAN EXISTS PATH '$.regions[*]',
      has_parents BOOLEAN EXISTS PATH '$.parents[*]',
      has_attributes BOOLEAN EXISTS PATH '$.attributes[*]',
      has_locks BOOLEAN EXISTS PATH '$.locks[*]')) jt
    WHERE jt.job_id IS NOT NULL;
  SELECT COUNT(*), COUNT(DISTINCT job_id), MAX(has_regions), MAX(has_parents), MAX(has_attributes), MAX(has_locks)
    INTO v_count, v_distinct, v_has_regions, v_has_parents, v_has_attributes, v_has_locks
    FROM tmp_new_jobs;
  IF v_count <> v_distinct THEN
    ROLLBACK;
    SELECT 3 AS rc, 'a job id appears twice in the bunch' AS message;
    LEAVE proc;
  END IF;
  IF v_count <> JSON_LENGTH(in_jobs) THEN
    ROLLBACK;
    SELECT 3 AS rc, 'every job needs a job_id' AS message;
    LEAVE proc;
  END IF;

  -- A re-sent bunch is recognised; a bunch overlapping an earlier one is not allowed.
  SELECT COUNT(*) INTO v_bad FROM jobs j JOIN tmp_new_jobs t ON j.batch_id = in_batch_id AND j.job_id = t.job_id;
  IF v_bad > 0 THEN
    ROLLBACK;
    IF v_bad = v_count THEN
      SELECT 0 AS rc, 'duplicate' AS message;
    ELSE
      SELECT 5 AS rc, 'some jobs of this bunch were inserted before, others not' AS message;
    END IF;
    LEAVE proc;
  END IF;

  -- Checked after the duplicate test: re-sending a bunch of an update that
  -- has been committed since is still just a duplicate.
  IF v_committed THEN
    ROLLBACK;
    SELECT 2 AS rc, 'the update is already committed' AS message;
    LEAVE proc;
  END IF;
  SELECT COUNT(*) INTO v_bad FROM tmp_new_jobs WHERE job_id < v_start OR job_id >= v_start + v_n;
  IF v_bad > 0 THEN
    ROLLBACK;
    SELECT 3 AS rc, CONCAT('job ids must lie in the update''s block [', v_start, ', ', v_start + v_n, ')') AS message;
    LEAVE proc;
  END IF;
  SELECT COUNT(*) INTO v_bad FROM tmp_new_jobs
    WHERE cores_mcpu IS NULL OR cores_mcpu < 0 OR memory_bytes < 0 OR storage_bytes < 0 OR max_attempts < 1
       OR timeout_ms <= 0;
  IF v_bad > 0 THEN
    ROLLBACK;
    SELECT 3 AS rc, CONCAT('cores_mcpu, memory_bytes, storage_bytes must be non-negative, max_attempts at least 1, ',
                           'a timeout positive') AS message;
    LEAVE proc;
  END IF;
  SELECT COUNT(*) INTO v_bad FROM tmp_new_jobs t LEFT JOIN instance_collections c ON c.name = t.inst_coll
    WHERE c.name IS NULL;
  IF v_bad > 0 THEN
    ROLLBACK;
    SELECT 3 AS rc, 'unknown instance collection' AS message;
    LEAVE proc;
  END IF;
  -- The job's group: the root, a committed group, or one of this update.
  SELECT COUNT(*) INTO v_bad FROM tmp_new_jobs t
    LEFT JOIN job_groups g ON g.batch_id = in_batch_id AND g.job_group_id = t.job_group_id
    LEFT JOIN batch_updates u ON u.batch_id = in_batch_id AND u.update_id = g.update_id
    WHERE g.job_group_id IS NULL OR NOT (g.update_id IS NULL OR g.update_id = in_update_id OR u.committed);
  IF v_bad > 0 THEN
    ROLLBACK;
    SELECT 3 AS rc, 'a job names a job group that does not exist (or is in another uncommitted update)' AS message;
    LEAVE proc;
  END IF;
  SELECT COUNT(*) INTO v_bad FROM tmp_new_jobs t
    WHERE EXISTS (SELECT 1 FROM job_groups_cancelled_self_or_ancestor x
                  WHERE x.batch_id = in_batch_id AND x.job_group_id = t.job_group_id);
  IF v_bad > 0 THEN
    ROLLBACK;
    SELECT 2 AS rc, 'a job names a cancelled job group' AS message;
    LEAVE proc;
  END IF;

  -- Regions by name -> bit set; unknown names are refused.
  IF v_has_regions THEN
    UPDATE tmp_new_jobs t
      JOIN (SELECT jt.job_id, BIT_OR(1 << r.region_id) AS bits, COUNT(*) AS n_named, COUNT(r.region_id) AS n_known
            FROM JSON_TABLE(in_jobs, '$[*]' COLUMNS (job_id INT PATH '$.job_id',
                   NESTED PATH '$.regions[*]' COLUMNS (region VARCHAR(64) PATH '$'))) jt
            LEFT JOIN regions r ON r.name = jt.region
            WHERE jt.region IS NOT NULL
            GROUP BY jt.job_id) x ON x.job_id = t.job_id
      SET t.regions_bits = IF(x.n_named = x.n_known, x.bits, -1);
    IF EXISTS (SELECT 1 FROM tmp_new_jobs WHERE regions_bits = -1) THEN
      ROLLBACK;
      SELECT 3 AS rc, 'unknown region' AS message;
      LEAVE proc;
    END IF;
  END IF;

  -- Edges, with relative parents resolved against the job's own id.
  IF v_has_parents THEN
    SELECT COUNT(*) INTO v_bad
      FROM JSON_TABLE(in_jobs, '$[*]' COLUMNS (job_id INT PATH '$.job_id',
             NESTED PATH '$.parents[*]' COLUMNS (ord FOR ORDINALITY, parent_id INT PATH '$.job_id',
                                                parent_offset INT PATH '$.in_update_offset',
                                                accepted INT PATH '$.accepted_states'))) jt
      WHERE jt.ord IS NOT NULL
        AND ((jt.parent_id IS NULL) = (jt.parent_offset IS NULL)
             OR jt.parent_offset >= 0
             OR COALESCE(jt.accepted, 1) NOT BETWEEN 1 AND 15);
    IF v_bad > 0 THEN
      ROLLBACK;
      SELECT 3 AS rc, 'each parent names exactly one of job_id or a negative in_update_offset, and accepted_states in 1..15' AS message;
      LEAVE proc;
    END IF;
    SELECT COUNT(*), COUNT(DISTINCT jt.job_id, COALESCE(jt.parent_id, jt.job_id + jt.parent_offset)) INTO v_count, v_distinct
      FROM JSON_TABLE(in_jobs, '$[*]' COLUMNS (job_id INT PATH '$.job_id',
             NESTED PATH '$.parents[*]' COLUMNS (ord FOR ORDINALITY, parent_id INT PATH '$.job_id',
                                                parent_offset INT PATH '$.in_update_offset'))) jt
      WHERE jt.ord IS NOT NULL;
    IF v_count <> v_distinct THEN
      ROLLBACK;
      SELECT 3 AS rc, 'a job names the same parent twice' AS message;
      LEAVE proc;
    END IF;
    INSERT INTO tmp_new_edges (job_id, parent_id, accepted_states)
      SELECT jt.job_id, COALESCE(jt.parent_id, jt.job_id + jt.parent_offset), COALESCE(jt.accepted, 1)
      FROM JSON_TABLE(in_jobs, '$[*]' COLUMNS (job_id INT PATH '$.job_id',
             NESTED PATH '$.parents[*]' COLUMNS (ord FOR ORDINALITY, parent_id INT PATH '$.job_id',
                                                parent_offset INT PATH '$.in_update_offset',
                                                accepted INT PATH '$.accepted_states'))) jt
      WHERE jt.ord IS NOT NULL;
    SELECT COUNT(*) INTO v_bad FROM tmp_new_edges
      WHERE parent_id >= job_id OR parent_id < 1;
    IF v_bad > 0 THEN
      ROLLBACK;
      SELECT 3 AS rc, 'a parent id must be smaller than its job''s id' AS message;
      LEAVE proc;
    END IF;
    -- Relative parents must stay inside the update.
    SELECT COUNT(*) INTO v_bad
      FROM JSON_TABLE(in_jobs, '$[*]' COLUMNS (job_id INT PATH '$.job_id',
             NESTED PATH '$.parents[*]' COLUMNS (ord FOR ORDINALITY, parent_offset INT PATH '$.in_update_offset'))) jt
      WHERE jt.parent_offset IS NOT NULL AND jt.job_id + jt.parent_offset < v_start;
    IF v_bad > 0 THEN
      ROLLBACK;
      SELECT 3 AS rc, 'an in_update_offset points before the start of the update' AS message;
      LEAVE proc;
    END IF;

    -- Parents in earlier updates: lock them shared and read their state now.
    SELECT COUNT(*) INTO v_locked
      FROM tmp_new_edges e JOIN jobs p ON p.batch_id = in_batch_id AND p.job_id = e.parent_id
      WHERE e.parent_id < v_start
      LOCK IN SHARE MODE;
    UPDATE tmp_new_edges e
      JOIN jobs p ON p.batch_id = in_batch_id AND p.job_id = e.parent_id
      JOIN batch_updates u ON u.batch_id = p.batch_id AND u.update_id = p.update_id
      SET e.parent_state = p.state, e.parent_committed = u.committed
      WHERE e.parent_id < v_start;
    SELECT COUNT(*) INTO v_bad FROM tmp_new_edges
      WHERE parent_id < v_start AND (parent_state IS NULL OR NOT parent_committed);
    IF v_bad > 0 THEN
      ROLLBACK;
      SELECT 3 AS rc, 'a parent outside this update must be a committed job of the batch' AS message;
      LEAVE proc;
    END IF;
    -- Final parents whose children are still being released: the queue row
    -- is share-locked (after the parent, as the releaser never locks parents),
    -- so its next_child_id cannot move past this job before we commit.
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

    -- Fan-out: no job may get more than in_max_children_per_job children.
    CALL fan_out_check(in_batch_id, in_max_children_per_job, v_fan_out);
    IF v_fan_out IS NOT NULL THEN
      ROLLBACK;
      SELECT 3 AS rc, v_fan_out AS message;
      LEAVE proc;
    END IF;

    UPDATE tmp_new_jobs t
      JOIN (SELECT job_id,
                   SUM(parent_state IS NULL OR parent_state NOT IN ('Success', 'Failed', 'Error', 'Cancelled')
                       OR release_pending) AS n_pending,
                   SUM(COALESCE(parent_state IN ('Success', 'Failed', 'Error', 'Cancelled') AND NOT release_pending
                                AND (accepted_states & CASE parent_state WHEN 'Success' THEN 1 WHEN 'Failed' THEN 2
                                                                         WHEN 'Error' THEN 4 ELSE 8 END) = 0,
                                FALSE)) AS n_unaccepted
            FROM tmp_new_edges GROUP BY job_id) x ON x.job_id = t.job_id
      SET t.n_pending_parents = x.n_pending, t.dependency_failed = (x.n_unaccepted > 0);
  END IF;

  INSERT INTO jobs (batch_id, job_id, update_id, job_group_id, user, state, dependency_failed, always_run,
                    n_pending_parents, cores_mcpu, memory_bytes, storage_bytes, inst_coll, regions_bits, priority,
                    max_attempts, spec_ref, time_created_ms, timeout_ms, retry_policy, on_demand, image)
    SELECT in_batch_id, job_id, in_update_id, job_group_id, v_user, 'Pending', dependency_failed, always_run,
           n_pending_parents, cores_mcpu, memory_bytes, storage_bytes, inst_coll, regions_bits, priority, max_attempts,
           spec_ref, in_now_ms, timeout_ms, retry_policy, on_demand, image
    FROM tmp_new_jobs ORDER BY job_id;
  INSERT INTO on_demand_jobs (batch_id, job_id, inst_coll)
    SELECT in_batch_id, job_id, inst_coll FROM tmp_new_jobs WHERE on_demand ORDER BY job_id;
  IF v_has_parents THEN
    INSERT INTO job_parents (batch_id, job_id, parent_id, accepted_states)
      SELECT in_batch_id, job_id, parent_id, accepted_states FROM tmp_new_edges ORDER BY job_id, parent_id;
  END IF;
  IF v_has_attributes THEN
    INSERT INTO job_attributes (batch_id, job_id, `key`, `value`)
      SELECT in_batch_id, jt.job_id, jt.k, jt.v
      FROM JSON_TABLE(in_jobs, '$[*]' COLUMNS (job_id INT PATH '$.job_id',
             NESTED PATH '$.attributes[*]' COLUMNS (k VARCHAR(100) PATH '$.key', v TEXT PATH '$.value'))) jt
      WHERE jt.k IS NOT NULL;
  END IF;

  IF v_has_locks THEN
    SELECT COUNT(*) INTO v_bad
      FROM JSON_TABLE(in_jobs, '$[*]' COLUMNS (job_id INT PATH '$.job_id',
             NESTED PATH '$.locks[*]' COLUMNS (ord FOR ORDINALITY, level VARCHAR(64) PATH '$.level',
                                              lock_mode VARCHAR(32) PATH '$.mode', lock_name VARCHAR(255) PATH '$.name'))) jt
      WHERE jt.ord IS NOT NULL
        AND (jt.level IS NULL OR jt.level = ''
             OR jt.lock_mode NOT IN ('shared', 'unknown_shared', 'all_shared', 'exclusive', 'unknown_exclusive', 'all_exclusive')
             OR jt.lock_mode IS NULL
             OR ((jt.lock_mode IN ('shared', 'exclusive')) <> (COALESCE(jt.lock_name, '') <> '')));
    IF v_bad > 0 THEN
      ROLLBACK;
      SELECT 3 AS rc, 'a lock needs a level and a known mode; only shared/exclusive locks name a resource' AS message;
      LEAVE proc;
    END IF;
    INSERT INTO job_locks (batch_id, job_id, level, mode, lock_name)
      SELECT DISTINCT in_batch_id, jt.job_id, jt.level, jt.lock_mode, COALESCE(jt.lock_name, '')
      FROM JSON_TABLE(in_jobs, '$[*]' COLUMNS (job_id INT PATH '$.job_id',
             NESTED PATH '$.locks[*]' COLUMNS (ord FOR ORDINALITY, level VARCHAR(64) PATH '$.level',
                                              lock_mode VARCHAR(32) PATH '$.mode', lock_name VARCHAR(255) PATH '$.name'))) jt
      WHERE jt.ord IS NOT NULL;
  END IF;
  COMMIT;
  DROP TEMPORARY TABLE IF EXISTS tmp_new_jobs;
  DROP TEMPORARY TABLE IF EXISTS tmp_new_edges;
  SELECT 0 AS rc, 'inserted' AS message;
END $$
DELIMITER ;
