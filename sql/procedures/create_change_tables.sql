-- Internal: the per-connection scratch tables through which the hot
-- procedures hand their changes to record_job_changes (job state changes:
-- counters and events) and bill_attempt_usage (rollup advances: billing
-- aggregates). Made once per connection and emptied with TRUNCATE, as
-- create_completion_tables explains.
DROP PROCEDURE IF EXISTS create_change_tables;
DELIMITER $$
CREATE PROCEDURE create_change_tables()
BEGIN
  -- One row per job whose state or dependency_failed flag changed, in the
  -- order its event is to be written (seq).
  IF @@in_transaction = 0 AND @corral_scratch_change_tables <=> 'f695a23bfc61' THEN
    TRUNCATE TABLE tmp_job_changes;
    TRUNCATE TABLE tmp_attempt_usage;
  ELSE
    SET @corral_scratch_change_tables = NULL;
    DROP TEMPORARY TABLE IF EXISTS tmp_job_changes;
    CREATE TEMPORARY TABLE tmp_job_changes (
      seq BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
      batch_id BIGINT NOT NULL,
      job_id INT NOT NULL,
      job_group_id INT NOT NULL,
      inst_coll VARCHAR(100) NOT NULL,
      cores_mcpu INT NOT NULL,
      always_run BOOLEAN NOT NULL,
      old_state VARCHAR(20) NOT NULL,
      new_state VARCHAR(20) NOT NULL,
      old_dependency_failed BOOLEAN NOT NULL,
      new_dependency_failed BOOLEAN NOT NULL,
      attempt_id VARCHAR(40) NULL,
      exit_code INT NULL
    );
    -- delta_ms more milliseconds of an attempt's resources to bill on the UTC
    -- day of rollup_time_ms.
    DROP TEMPORARY TABLE IF EXISTS tmp_attempt_usage;
    CREATE TEMPORARY TABLE tmp_attempt_usage (
      batch_id BIGINT NOT NULL,
      job_id INT NOT NULL,
      attempt_id VARCHAR(40) NOT NULL,
      delta_ms BIGINT NOT NULL,
      rollup_time_ms BIGINT NULL,
      KEY (batch_id, job_id, attempt_id)
    );
    SET @corral_scratch_change_tables = 'f695a23bfc61';
  END IF;
END $$
DELIMITER ;
