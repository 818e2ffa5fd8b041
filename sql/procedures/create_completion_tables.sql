-- Internal: (re)creates the per-connection scratch tables that
-- complete_jobs_core and check_completions work on.
DROP PROCEDURE IF EXISTS create_completion_tables;
DELIMITER $$
CREATE PROCEDURE create_completion_tables()
BEGIN
  DROP TEMPORARY TABLE IF EXISTS tmp_job_completions;
  CREATE TEMPORARY TABLE tmp_job_completions (
    batch_id BIGINT NOT NULL,
    job_id INT NOT NULL,
    attempt_id VARCHAR(40) NULL,
    instance_name VARCHAR(100) NULL,
    new_state VARCHAR(20) NOT NULL,
    exit_code INT NULL,
    start_time_ms BIGINT NULL,
    end_time_ms BIGINT NULL,
    reason VARCHAR(64) NULL,
    error_message TEXT NULL,
    cpu_time_ms BIGINT NULL,
    peak_memory_bytes BIGINT NULL,
    found BOOLEAN NOT NULL DEFAULT FALSE,
    old_state VARCHAR(20) NULL,
    old_attempt_id VARCHAR(40) NULL,
    job_group_id INT NULL,
    cores_mcpu INT NULL,
    outcome VARCHAR(32) NULL,
    PRIMARY KEY (batch_id, job_id)
  );
  DROP TEMPORARY TABLE IF EXISTS tmp_groups_to_check;
  CREATE TEMPORARY TABLE tmp_groups_to_check (
    batch_id BIGINT NOT NULL,
    job_group_id INT NOT NULL,
    PRIMARY KEY (batch_id, job_group_id)
  );
END $$
DELIMITER ;
