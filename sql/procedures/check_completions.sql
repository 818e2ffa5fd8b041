-- Internal, called AFTER the caller's transaction committed: marks groups in
-- tmp_groups_to_check complete when every committed job in them is final,
-- and a batch complete when its root group is.
--
-- Why after commit: completion counters are tokenized, so two transactions
-- finishing the last two jobs each see only their own increment while
-- uncommitted. Checked after commit with a fresh read, the transaction that
-- committed last always sees every increment, and the conditional UPDATE
-- (state = 'running') lets exactly one caller win. If a process dies between
-- commit and this check, the driver's completion loop calls it again.
--
-- Holds of single jobs (jobs_held, migration 0029) go with the batch's
-- completion: every job of it is final, so they hold nothing, and the reads
-- that look at every held job (the queue heads, the demand) see only those
-- of running batches.
--
-- Events: the transaction that flips a batch to complete appends its
-- batch_completed event, with the final counts, whether it was cancelled and
-- its cost. Every job's final change committed before this check could see
-- the batch complete, so those events are already in the outbox with a
-- smaller seq and are published with smaller ids.
DROP PROCEDURE IF EXISTS check_completions;
DELIMITER $$
CREATE PROCEDURE check_completions(IN in_now_ms BIGINT)
BEGIN
  DECLARE v_done BOOLEAN DEFAULT FALSE;
  DECLARE v_batch_id BIGINT;
  DECLARE v_n_jobs INT;
  DECLARE v_completed_ms BIGINT;
  DECLARE v_n_succeeded INT;
  DECLARE v_n_failed INT;
  DECLARE v_n_errored INT;
  DECLARE v_n_cancelled INT;
  DECLARE v_cost_micro_usd BIGINT;
  DECLARE batch_cursor CURSOR FOR
    SELECT DISTINCT batch_id FROM tmp_groups_to_check ORDER BY batch_id;
  DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_done = TRUE;
  DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;

  UPDATE job_groups g
    JOIN tmp_groups_to_check x ON x.batch_id = g.batch_id AND x.job_group_id = g.job_group_id
    SET g.state = 'complete', g.time_completed_ms = in_now_ms
    WHERE g.state = 'running'
      AND g.n_jobs = (SELECT COALESCE(SUM(s.n_completed), 0)
                      FROM job_groups_n_jobs_in_complete_states s
                      WHERE s.batch_id = g.batch_id AND s.job_group_id = g.job_group_id);

  OPEN batch_cursor;
  batches: LOOP
    FETCH batch_cursor INTO v_batch_id;
    IF v_done THEN LEAVE batches; END IF;
    START TRANSACTION;
    UPDATE batches b
      JOIN job_groups g ON g.batch_id = b.batch_id AND g.job_group_id = 0
      SET b.state = 'complete', b.time_completed_ms = g.time_completed_ms
      WHERE b.batch_id = v_batch_id AND b.state = 'running' AND g.state = 'complete';
    IF ROW_COUNT() = 1 THEN
      INSERT INTO batch_completions (batch_id, n_jobs, time_completed_ms)
        SELECT batch_id, n_jobs, time_completed_ms FROM batches WHERE batch_id = v_batch_id;
      DELETE FROM jobs_held WHERE batch_id = v_batch_id;
      SELECT n_jobs, time_completed_ms INTO v_n_jobs, v_completed_ms FROM batches WHERE batch_id = v_batch_id;
      SELECT COALESCE(SUM(n_succeeded), 0), COALESCE(SUM(n_failed), 0), COALESCE(SUM(n_errored), 0),
             COALESCE(SUM(n_cancelled), 0)
        INTO v_n_succeeded, v_n_failed, v_n_errored, v_n_cancelled
        FROM job_groups_n_jobs_in_complete_states WHERE batch_id = v_batch_id AND job_group_id = 0;
      SELECT COALESCE(ROUND(SUM(a.`usage` * r.rate_usd) * 1000000), 0) INTO v_cost_micro_usd
        FROM aggregated_job_group_resources a JOIN resources r ON r.resource_id = a.resource_id
        WHERE a.batch_id = v_batch_id AND a.job_group_id = 0;
      INSERT INTO batch_event_outbox
          (batch_id, kind, n_jobs, n_succeeded, n_failed, n_errored, n_cancelled, cancelled, cost_micro_usd, time_ms)
        VALUES (v_batch_id, 'batch_completed', v_n_jobs, v_n_succeeded, v_n_failed, v_n_errored, v_n_cancelled,
                EXISTS (SELECT 1 FROM job_groups_cancelled WHERE batch_id = v_batch_id AND job_group_id = 0),
                v_cost_micro_usd, v_completed_ms);
    END IF;
    COMMIT;
  END LOOP;
  CLOSE batch_cursor;
  DELETE FROM tmp_groups_to_check;
END $$
DELIMITER ;
