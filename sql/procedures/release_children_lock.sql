-- Internal, first step of releasing children (complete_jobs_core for the
-- parents it completes, release_children for queued ones): the caller has
-- put the parents in tmp_releases with the first child id still to release
-- (from_child_id). Each parent's range ends before its (in_span + 1)-th
-- child from there (to_child_id; NULL: its children run out within
-- in_span), so a call handles at most in_span children per parent. The
-- children in the ranges go into tmp_children and are locked, in key order,
-- before anything else the caller locks after its targets (lock order:
-- targets, children, attempts, instances, token rows). out_n_children: how
-- many children.
--
-- Every read of job_parents_parent stops near where the range does: never
-- the whole fan-out of a parent with a million children. A join of
-- tmp_releases with job_parents cannot stop there (MariaDB reads a join's
-- inner side by (batch_id, parent_id) and filters job_id after: each chunk
-- would read every child before it), so:
--   - a parent released from its first child (by a completion) with at most
--     in_span + 2,000 children, found by scalar subqueries that stop after
--     that many entries, is taken in one join with the others like it;
--   - every other parent (a queued one, or a large fan-out) is taken on its
--     own, its range's bounds as constants.
-- With in_span 0 nothing is read but each parent's first child.
DROP PROCEDURE IF EXISTS release_children_lock;
DELIMITER $$
CREATE PROCEDURE release_children_lock(IN in_span INT, OUT out_n_children INT)
proc: BEGIN
  DECLARE v_locked INT;
  DECLARE v_far INT;
  DECLARE v_n_alone INT;
  DECLARE v_i INT DEFAULT 0;
  DECLARE v_batch_id BIGINT;
  DECLARE v_parent_id INT;
  DECLARE v_from INT;
  DECLARE v_to INT;
  DECLARE v_accepted_bit INT;

  SET out_n_children = 0;
  IF in_span = 0 THEN
    UPDATE tmp_releases r
      SET r.to_child_id = (SELECT e.job_id FROM job_parents e FORCE INDEX (job_parents_parent)
                           WHERE e.batch_id = r.batch_id AND e.parent_id = r.parent_id
                             AND e.job_id >= r.from_child_id
                           ORDER BY e.job_id
                           LIMIT 1);
    LEAVE proc;
  END IF;

  SET v_far = in_span + 2000;
  UPDATE tmp_releases r
    SET r.to_child_id = (SELECT e.job_id FROM job_parents e FORCE INDEX (job_parents_parent)
                         WHERE e.batch_id = r.batch_id AND e.parent_id = r.parent_id
                         ORDER BY e.job_id
                         LIMIT 1 OFFSET in_span),
        r.alone = (SELECT e.job_id FROM job_parents e FORCE INDEX (job_parents_parent)
                   WHERE e.batch_id = r.batch_id AND e.parent_id = r.parent_id
                   ORDER BY e.job_id
                   LIMIT 1 OFFSET v_far) IS NOT NULL
    WHERE r.from_child_id = 0;
  UPDATE tmp_releases SET alone = TRUE WHERE from_child_id > 0;
  INSERT INTO tmp_children (batch_id, job_id, n_done, n_unaccepted)
    SELECT e.batch_id, e.job_id, COUNT(*),
           SUM((e.accepted_states & CASE r.parent_state WHEN 'Success' THEN 1 WHEN 'Failed' THEN 2
                                                       WHEN 'Error' THEN 4 ELSE 8 END) = 0)
    FROM tmp_releases r
    JOIN job_parents e FORCE INDEX (job_parents_parent) ON e.batch_id = r.batch_id AND e.parent_id = r.parent_id
    WHERE NOT r.alone AND (r.to_child_id IS NULL OR e.job_id < r.to_child_id)
    GROUP BY e.batch_id, e.job_id;

  -- The others one at a time, walked in key order through a numbered copy, made only
  -- when there are some: dropping a temporary table makes the connection load and
  -- parse its routines again on its next call (see create_completion_tables).
  IF EXISTS (SELECT 1 FROM tmp_releases WHERE alone) THEN
    DROP TEMPORARY TABLE IF EXISTS tmp_release_walk;
    CREATE TEMPORARY TABLE tmp_release_walk (
      seq INT NOT NULL AUTO_INCREMENT PRIMARY KEY,
      batch_id BIGINT NOT NULL,
      parent_id INT NOT NULL,
      parent_state VARCHAR(20) NOT NULL,
      from_child_id INT NOT NULL
    );
    INSERT INTO tmp_release_walk (batch_id, parent_id, parent_state, from_child_id)
      SELECT batch_id, parent_id, parent_state, from_child_id FROM tmp_releases WHERE alone
      ORDER BY batch_id, parent_id;
    SET v_n_alone = ROW_COUNT();
    WHILE v_i < v_n_alone DO
      SET v_i = v_i + 1;
      SELECT batch_id, parent_id, from_child_id,
             CASE parent_state WHEN 'Success' THEN 1 WHEN 'Failed' THEN 2 WHEN 'Error' THEN 4 ELSE 8 END
        INTO v_batch_id, v_parent_id, v_from, v_accepted_bit
        FROM tmp_release_walk WHERE seq = v_i;
      SET v_to = (SELECT job_id FROM job_parents FORCE INDEX (job_parents_parent)
                  WHERE batch_id = v_batch_id AND parent_id = v_parent_id AND job_id >= v_from
                  ORDER BY job_id
                  LIMIT 1 OFFSET in_span);
      INSERT INTO tmp_children (batch_id, job_id, n_done, n_unaccepted)
        SELECT batch_id, job_id, 1, (accepted_states & v_accepted_bit) = 0
        FROM job_parents FORCE INDEX (job_parents_parent)
        WHERE batch_id = v_batch_id AND parent_id = v_parent_id
          AND job_id >= v_from AND (v_to IS NULL OR job_id < v_to)
      ON DUPLICATE KEY UPDATE n_done = tmp_children.n_done + 1,
                              n_unaccepted = tmp_children.n_unaccepted + VALUES(n_unaccepted);
      UPDATE tmp_releases SET to_child_id = v_to WHERE batch_id = v_batch_id AND parent_id = v_parent_id;
    END WHILE;
    DROP TEMPORARY TABLE IF EXISTS tmp_release_walk;
  END IF;

  SELECT COUNT(*) INTO out_n_children FROM tmp_children;
  IF out_n_children > 0 THEN
    SELECT COUNT(*) INTO v_locked
      FROM tmp_children c
      JOIN jobs j ON j.batch_id = c.batch_id AND j.job_id = c.job_id
      FOR UPDATE;
  END IF;
END $$
DELIMITER ;
