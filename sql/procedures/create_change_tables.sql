-- Internal: the per-connection scratch tables through which the hot
-- procedures hand their changes to record_job_changes (job state changes:
-- counters and events) and bill_attempt_usage (rollup advances: billing
-- aggregates). Dropped and created again on every call, never emptied with
-- DELETE: InnoDB never purges the rows deleted from a temporary table, so a
-- reused one made every scan of it slower with each call the connection had
-- served (a pooled driver connection serves millions).
DROP PROCEDURE IF EXISTS create_change_tables;
DELIMITER $$
CREATE PROCEDURE create_change_tables()
BEGIN
  -- One row per job whose state or dependency_failed flag changed, in the
  -- order its event is to be written (seq).
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
END $$
DELIMITER ;
