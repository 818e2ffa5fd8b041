-- Internal: queue an update's groups, their ancestors and the root for
-- check_completions (an empty update or group completes at once).
DROP PROCEDURE IF EXISTS queue_update_groups_for_check;
DELIMITER $$
CREATE PROCEDURE queue_update_groups_for_check(IN in_batch_id BIGINT, IN in_update_id INT)
BEGIN
  INSERT INTO tmp_groups_to_check (batch_id, job_group_id) VALUES (in_batch_id, 0)
  ON DUPLICATE KEY UPDATE batch_id = tmp_groups_to_check.batch_id;
  INSERT INTO tmp_groups_to_check (batch_id, job_group_id)
    SELECT DISTINCT a.batch_id, a.ancestor_id
    FROM job_groups g
    JOIN job_group_self_and_ancestors a ON a.batch_id = g.batch_id AND a.job_group_id = g.job_group_id
    WHERE g.batch_id = in_batch_id AND g.update_id = in_update_id
  ON DUPLICATE KEY UPDATE batch_id = tmp_groups_to_check.batch_id;
END $$
DELIMITER ;
