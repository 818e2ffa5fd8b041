-- Adds job groups to an uncommitted update. in_groups: [{"job_group_id",
-- "parent_id", "cancel_after_n_failures", "attributes": [{"key", "value"}],
-- "retry_policy": "{...}" (the policy's JSON as a string; migration 0014)}]
-- with absolute ids inside the update's reserved group block; a parent is
-- the root (0), a committed group, or a group of this update inserted
-- earlier (lower id). Nothing is written unless every group is valid; a
-- re-sent call is recognised and returns 'duplicate'.
DROP PROCEDURE IF EXISTS insert_job_groups;
DELIMITER $$
CREATE PROCEDURE insert_job_groups(IN in_batch_id BIGINT, IN in_update_id INT, IN in_groups JSON, IN in_now_ms BIGINT)
proc: BEGIN
  DECLARE v_start INT;
  DECLARE v_n INT;
  DECLARE v_committed BOOLEAN;
  DECLARE v_count INT;
  DECLARE v_existing INT;
  DECLARE v_done BOOLEAN DEFAULT FALSE;
  DECLARE v_group_id INT;
  DECLARE v_parent_id INT;
  DECLARE v_cancel_after INT;
  DECLARE v_retry_policy TEXT;
  DECLARE v_parent_depth INT;
  DECLARE v_parent_update INT;
  DECLARE v_parent_committed BOOLEAN;
  DECLARE groups_cursor CURSOR FOR
    SELECT jt.job_group_id, jt.parent_id, jt.cancel_after, jt.retry_policy
    FROM JSON_TABLE(in_groups, '$[*]' COLUMNS (job_group_id INT PATH '$.job_group_id', parent_id INT PATH '$.parent_id',
                                                cancel_after INT PATH '$.cancel_after_n_failures',
                                                retry_policy TEXT PATH '$.retry_policy')) jt
    ORDER BY jt.job_group_id;
  DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_done = TRUE;
  DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;
  -- 1062 (duplicate key): a call sent concurrently committed some of these
  -- groups first (both saw none of them before inserting); answer as for a
  -- call sent after it.
  DECLARE EXIT HANDLER FOR 1062
  BEGIN
    ROLLBACK;
    SELECT COUNT(*), COUNT(g.job_group_id) INTO v_count, v_existing
      FROM JSON_TABLE(in_groups, '$[*]' COLUMNS (g INT PATH '$.job_group_id')) jt
      LEFT JOIN job_groups g ON g.batch_id = in_batch_id AND g.job_group_id = jt.g;
    IF v_existing = 0 THEN
      RESIGNAL;  -- not a group of this call: not a call sent twice
    END IF;
    SELECT IF(v_existing = v_count, 0, 5) AS rc,
           IF(v_existing = v_count, 'duplicate', 'some of these job groups were inserted before, others not')
             AS message;
  END;

  IF in_groups IS NULL OR JSON_TYPE(in_groups) <> 'ARRAY' THEN
    SELECT 3 AS rc, 'groups must be a JSON array' AS message;
    LEAVE proc;
  END IF;
  START TRANSACTION;
  -- Lock order: the batch (shared) before its update row, as commit_update
  -- takes them exclusively in that order.
  SELECT COUNT(*) INTO v_count FROM batches WHERE batch_id = in_batch_id LOCK IN SHARE MODE;
  SELECT start_job_group_id, n_job_groups, committed INTO v_start, v_n, v_committed
    FROM batch_updates WHERE batch_id = in_batch_id AND update_id = in_update_id LOCK IN SHARE MODE;
  IF v_done THEN
    ROLLBACK;
    SELECT 1 AS rc, CONCAT('no update ', in_update_id, ' of batch ', in_batch_id) AS message;
    LEAVE proc;
  END IF;
  IF v_committed THEN
    ROLLBACK;
    SELECT 2 AS rc, 'the update is already committed' AS message;
    LEAVE proc;
  END IF;
  SELECT COUNT(*), COUNT(DISTINCT jt.g),
         SUM(jt.g IS NULL OR jt.g < v_start OR jt.g >= v_start + v_n OR jt.p IS NULL OR jt.p >= jt.g
             OR (jt.c IS NOT NULL AND jt.c < 1))
    INTO v_count, v_existing, v_group_id
    FROM JSON_TABLE(in_groups, '$[*]' COLUMNS (g INT PATH '$.job_group_id', p INT PATH '$.parent_id',
                                                c INT PATH '$.cancel_after_n_failures')) jt;
  IF v_count <> v_existing OR v_group_id > 0 THEN
    ROLLBACK;
    SELECT 3 AS rc, CONCAT('job group ids must be distinct and within [', v_start, ', ', v_start + v_n,
                           '), each with a smaller parent_id, and cancel_after_n_failures >= 1') AS message;
    LEAVE proc;
  END IF;
  SELECT COUNT(*) INTO v_existing
    FROM job_groups g
    JOIN JSON_TABLE(in_groups, '$[*]' COLUMNS (g INT PATH '$.job_group_id')) jt ON jt.g = g.job_group_id
    WHERE g.batch_id = in_batch_id;
  IF v_existing > 0 THEN
    ROLLBACK;
    IF v_existing = v_count THEN
      SELECT 0 AS rc, 'duplicate' AS message;
    ELSE
      SELECT 5 AS rc, 'some of these job groups were inserted before, others not' AS message;
    END IF;
    LEAVE proc;
  END IF;

  OPEN groups_cursor;
  groups_loop: LOOP
    FETCH groups_cursor INTO v_group_id, v_parent_id, v_cancel_after, v_retry_policy;
    IF v_done THEN LEAVE groups_loop; END IF;
    SELECT depth, update_id INTO v_parent_depth, v_parent_update
      FROM job_groups WHERE batch_id = in_batch_id AND job_group_id = v_parent_id LOCK IN SHARE MODE;
    IF v_done THEN
      ROLLBACK;
      SELECT 3 AS rc, CONCAT('job group ', v_group_id, ': parent ', v_parent_id, ' does not exist') AS message;
      LEAVE proc;
    END IF;
    SET v_parent_committed = (v_parent_update IS NULL OR v_parent_update = in_update_id OR
      EXISTS (SELECT 1 FROM batch_updates WHERE batch_id = in_batch_id AND update_id = v_parent_update AND committed));
    IF NOT v_parent_committed THEN
      ROLLBACK;
      SELECT 3 AS rc, CONCAT('job group ', v_group_id, ': parent ', v_parent_id, ' is in an uncommitted update') AS message;
      LEAVE proc;
    END IF;
    IF v_parent_depth >= 7 THEN
      ROLLBACK;
      SELECT 3 AS rc, CONCAT('job group ', v_group_id, ': groups nest at most 7 deep') AS message;
      LEAVE proc;
    END IF;
    IF EXISTS (SELECT 1 FROM job_groups_cancelled_self_or_ancestor x
               WHERE x.batch_id = in_batch_id AND x.job_group_id = v_parent_id) THEN
      ROLLBACK;
      SELECT 2 AS rc, CONCAT('job group ', v_parent_id, ' is cancelled') AS message;
      LEAVE proc;
    END IF;
    INSERT INTO job_groups (batch_id, job_group_id, parent_id, update_id, depth, cancel_after_n_failures,
                            retry_policy, time_created_ms)
      VALUES (in_batch_id, v_group_id, v_parent_id, in_update_id, v_parent_depth + 1, v_cancel_after,
              v_retry_policy, in_now_ms);
    INSERT INTO job_group_self_and_ancestors (batch_id, job_group_id, ancestor_id, level)
      SELECT in_batch_id, v_group_id, ancestor_id, level + 1
      FROM job_group_self_and_ancestors WHERE batch_id = in_batch_id AND job_group_id = v_parent_id
      UNION ALL SELECT in_batch_id, v_group_id, v_group_id, 0;
  END LOOP;
  CLOSE groups_cursor;

  INSERT INTO job_group_attributes (batch_id, job_group_id, `key`, `value`)
    SELECT in_batch_id, jt.g, jt.k, jt.v
    FROM JSON_TABLE(in_groups, '$[*]' COLUMNS (g INT PATH '$.job_group_id',
           NESTED PATH '$.attributes[*]' COLUMNS (k VARCHAR(100) PATH '$.key', v TEXT PATH '$.value'))) jt
    WHERE jt.k IS NOT NULL;
  COMMIT;
  SELECT 0 AS rc, 'inserted' AS message;
END $$
DELIMITER ;
