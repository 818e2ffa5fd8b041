-- Internal (insert_jobs, rerun_failed_jobs): would the edges about to be
-- inserted into batch in_batch_id give a job more than
-- in_max_children_per_job children, counting the children it has? The
-- edges are the caller's scratch table tmp_new_edges (one row per
-- (job_id, parent_id)). out_message is NULL if not (or with no limit),
-- else names the parent of lowest id that would pass it; the callers
-- refuse with rc 3 (INVALID_ARGUMENT) and this message.
-- Edges inserted concurrently by another transaction are seen only once
-- committed, so bunches inserted together may pass the limit by up to
-- their own edges.
DROP PROCEDURE IF EXISTS fan_out_check;
DELIMITER $$
CREATE PROCEDURE fan_out_check(IN in_batch_id BIGINT, IN in_max_children_per_job INT,
                               OUT out_message VARCHAR(1024))
BEGIN
  DECLARE v_parent INT DEFAULT NULL;
  DECLARE v_n_children BIGINT;
  -- No parent passes the limit: the SELECT INTO finds no row. Handled here, so
  -- that the caller's own NOT FOUND handler does not see it.
  DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_parent = NULL;
  SET out_message = NULL;
  IF in_max_children_per_job IS NOT NULL THEN
    SELECT parent_id, n_children INTO v_parent, v_n_children
      FROM (SELECT x.parent_id,
                   x.n + (SELECT COUNT(*) FROM job_parents p FORCE INDEX (job_parents_parent)
                          WHERE p.batch_id = in_batch_id AND p.parent_id = x.parent_id) AS n_children
            FROM (SELECT parent_id, COUNT(*) AS n FROM tmp_new_edges GROUP BY parent_id) x) y
      WHERE n_children > in_max_children_per_job
      ORDER BY parent_id
      LIMIT 1;
    IF v_parent IS NOT NULL THEN
      SET out_message = CONCAT('job ', v_parent, ' would have ', FORMAT(v_n_children, 0),
                               ' children; the limit (max_children_per_job) is ',
                               FORMAT(in_max_children_per_job, 0));
    END IF;
  END IF;
END $$
DELIMITER ;
