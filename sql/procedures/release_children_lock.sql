-- Internal, first step of releasing children (complete_jobs_core for the
-- parents it completes, release_children for queued ones): the caller has
-- put the parents in tmp_releases with the first child id still to release
-- (from_child_id). Each parent's range ends before its (in_span + 1)-th
-- child from there (to_child_id; NULL: its children run out within
-- in_span), so a call handles at most in_span children per parent, read by
-- index ranges of job_parents_parent: never the whole fan-out of a parent
-- with a million children. The children in the ranges go into tmp_children
-- and are locked, in key order, before anything else the caller locks after
-- its targets (lock order: targets, children, attempts, instances, token
-- rows). out_n_children: how many children.
DROP PROCEDURE IF EXISTS release_children_lock;
DELIMITER $$
CREATE PROCEDURE release_children_lock(IN in_span INT, OUT out_n_children INT)
BEGIN
  DECLARE v_locked INT;

  UPDATE tmp_releases r
    SET r.to_child_id = (SELECT e.job_id FROM job_parents e FORCE INDEX (job_parents_parent)
                         WHERE e.batch_id = r.batch_id AND e.parent_id = r.parent_id AND e.job_id >= r.from_child_id
                         ORDER BY e.job_id
                         LIMIT 1 OFFSET in_span);
  INSERT INTO tmp_children (batch_id, job_id, n_done, n_unaccepted)
    SELECT e.batch_id, e.job_id, COUNT(*),
           SUM((e.accepted_states & CASE r.parent_state WHEN 'Success' THEN 1 WHEN 'Failed' THEN 2
                                                       WHEN 'Error' THEN 4 ELSE 8 END) = 0)
    FROM tmp_releases r
    JOIN job_parents e FORCE INDEX (job_parents_parent)
      ON e.batch_id = r.batch_id AND e.parent_id = r.parent_id
     AND e.job_id >= r.from_child_id AND (r.to_child_id IS NULL OR e.job_id < r.to_child_id)
    GROUP BY e.batch_id, e.job_id;
  SET out_n_children = ROW_COUNT();
  IF out_n_children > 0 THEN
    SELECT COUNT(*) INTO v_locked
      FROM tmp_children c
      JOIN jobs j ON j.batch_id = c.batch_id AND j.job_id = c.job_id
      FOR UPDATE;
  END IF;
END $$
DELIMITER ;
