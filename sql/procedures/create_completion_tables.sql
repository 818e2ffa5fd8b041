-- Internal: the per-connection scratch tables that complete_jobs_core,
-- release_children and check_completions work on, and the ones they hand
-- their counters, events and billing through (create_change_tables), all
-- empty.
-- A connection makes them once and empties them with TRUNCATE on later
-- calls; it drops and makes them again only on its first call, after their
-- definitions change (the version below, a hash of the CREATE statements that
-- a unit test checks), or inside an open transaction, where TRUNCATE would
-- commit the caller's work (it commits implicitly, even for a temporary
-- table; outside a transaction there is nothing to commit).
-- Not DROP on every call: dropping a temporary table makes the connection
-- load and parse every routine it calls again on its next call, which was a
-- fifth of the database's CPU in a run of simulated workers. Not DELETE:
-- InnoDB never purges the rows deleted from a temporary table, so one emptied
-- that way made every scan of it slower with each call the connection had
-- served (a pooled driver connection serves millions).
DROP PROCEDURE IF EXISTS create_completion_tables;
DELIMITER $$
CREATE PROCEDURE create_completion_tables()
BEGIN
  IF @@in_transaction = 0 AND @corral_scratch_completion_tables <=> 'aa6fedcb84a4' THEN
    TRUNCATE TABLE tmp_job_completions;
    TRUNCATE TABLE tmp_groups_to_check;
    TRUNCATE TABLE tmp_instance_cores;
    TRUNCATE TABLE tmp_releases;
    TRUNCATE TABLE tmp_children;
  ELSE
    SET @corral_scratch_completion_tables = NULL;
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
      inst_coll VARCHAR(100) NULL,
      cores_mcpu INT NULL,
      memory_bytes BIGINT NULL,
      storage_bytes BIGINT NULL,
      always_run BOOLEAN NULL,
      dependency_failed BOOLEAN NULL,
      -- Set by cancel_pending_jobs only: a Pending job may become Cancelled.
      may_cancel_pending BOOLEAN NOT NULL DEFAULT FALSE,
      -- Set by mark_jobs_complete and deactivate_instance: the attempt's end may
      -- make a new attempt instead of a final state (decide_retries).
      may_retry BOOLEAN NOT NULL DEFAULT FALSE,
      -- FALSE (deactivate_instance): the attempt is billed to its last rollup,
      -- not to its end (time no worker vouched for).
      bill_to_end BOOLEAN NOT NULL DEFAULT TRUE,
      -- decide_retries' inputs and decision, for outcome 'retried'.
      retry_policy TEXT NULL,
      n_attempts INT NULL,
      max_attempts INT NULL,
      pool_memory_bytes BIGINT NULL,
      n_preemptions INT NULL,
      n_failed_retries INT NULL,
      next_memory_bytes BIGINT NULL,
      not_before_ms BIGINT NULL,
      avoid_instance VARCHAR(100) NULL,
      to_on_demand BOOLEAN NOT NULL DEFAULT FALSE,
      retry_reason VARCHAR(255) NULL,
      retry_delay_ms BIGINT NULL,
      outcome VARCHAR(32) NOT NULL DEFAULT 'not_found',
      PRIMARY KEY (batch_id, job_id)
    );
    DROP TEMPORARY TABLE IF EXISTS tmp_groups_to_check;
    CREATE TEMPORARY TABLE tmp_groups_to_check (
      batch_id BIGINT NOT NULL,
      job_group_id INT NOT NULL,
      PRIMARY KEY (batch_id, job_group_id)
    );
    -- Cores to give back per instance.
    DROP TEMPORARY TABLE IF EXISTS tmp_instance_cores;
    CREATE TEMPORARY TABLE tmp_instance_cores (
      instance_name VARCHAR(100) NOT NULL PRIMARY KEY,
      cores_mcpu BIGINT NOT NULL,
      memory_bytes BIGINT NOT NULL,
      storage_bytes BIGINT NOT NULL
    );
    -- Parents whose children this call releases: the children with
    -- from_child_id <= job_id < to_child_id (NULL: no upper end) of each
    -- (release_children_lock fills in to_child_id, and whether it reads the
    -- parent's range alone).
    DROP TEMPORARY TABLE IF EXISTS tmp_releases;
    CREATE TEMPORARY TABLE tmp_releases (
      batch_id BIGINT NOT NULL,
      parent_id INT NOT NULL,
      parent_state VARCHAR(20) NOT NULL,
      from_child_id INT NOT NULL,
      to_child_id INT NULL,
      alone BOOLEAN NOT NULL DEFAULT FALSE,
      PRIMARY KEY (batch_id, parent_id)
    );
    -- The children those ranges hold, one row per child: how many of its
    -- parents are released now (n_done) and how many of those ended in a
    -- state its edge does not accept; then what it was and becomes.
    DROP TEMPORARY TABLE IF EXISTS tmp_children;
    CREATE TEMPORARY TABLE tmp_children (
      batch_id BIGINT NOT NULL,
      job_id INT NOT NULL,
      n_done INT NOT NULL,
      n_unaccepted INT NOT NULL,
      job_group_id INT NULL,
      inst_coll VARCHAR(100) NULL,
      cores_mcpu INT NULL,
      always_run BOOLEAN NULL,
      attempt_id VARCHAR(40) NULL,
      old_state VARCHAR(20) NULL,
      old_dependency_failed BOOLEAN NULL,
      n_pending_parents INT NULL,
      becomes_ready BOOLEAN NOT NULL DEFAULT FALSE,
      PRIMARY KEY (batch_id, job_id)
    );
    SET @corral_scratch_completion_tables = 'aa6fedcb84a4';
  END IF;
  CALL create_change_tables();
END $$
DELIMITER ;
