-- corral's data model (design §3). Conventions:
--   * units in names: *_ms are milliseconds since the epoch (UTC) or durations,
--     *_mcpu are thousandths of a core, *_bytes are bytes;
--   * static facts and dynamic state live in separate tables where the dynamic
--     part is written concurrently (cancellation, counters, heartbeats);
--   * counters written by many concurrent transactions are TOKENIZED: one row
--     per (key, token), token = CONNECTION_ID() MOD 64, readers SUM over the
--     tokens. Two connections never share a row unless their ids collide mod
--     64, so completions, schedules and rollups of one batch do not serialize
--     on a single hot row (the seed system's per-batch completion row did).
--
-- Lock order, used by every procedure and trigger (see docs/architecture.md):
--   leader_epoch (shared) -> billing_projects -> batches -> batch_updates ->
--   job_groups -> jobs (targets, ascending key) -> jobs (children, ascending)
--   -> attempts -> instances -> token rows of counters and aggregates.
--
-- The tokenized counter and aggregate tables have no foreign keys on
-- purpose: a foreign-key check takes a shared lock on the parent row (the
-- job group, the job), which deadlocks with the completion check and with
-- the jobs' own updates. Their rows are removed with their batch by the
-- cleanup procedure instead of by ON DELETE CASCADE.

CREATE TABLE leader_epoch (
  singleton TINYINT NOT NULL PRIMARY KEY DEFAULT 1,
  epoch BIGINT NOT NULL,
  leader_name VARCHAR(255) NULL,
  elected_at_ms BIGINT NULL,
  CONSTRAINT leader_epoch_single_row CHECK (singleton = 1)
) ENGINE=InnoDB;

INSERT INTO leader_epoch (singleton, epoch) VALUES (1, 0);

-- Regions jobs may ask for; region_id is a bit position in jobs.regions_bits.
CREATE TABLE regions (
  region_id TINYINT NOT NULL PRIMARY KEY,
  name VARCHAR(64) NOT NULL UNIQUE,
  CONSTRAINT regions_bit_range CHECK (region_id BETWEEN 0 AND 62)
) ENGINE=InnoDB;

-- Priced resources. A resource name carries its version so a price change is
-- a new row and old usage keeps its old rate: cost = usage * rate_usd.
CREATE TABLE resources (
  resource_id INT NOT NULL AUTO_INCREMENT PRIMARY KEY,
  name VARCHAR(128) NOT NULL UNIQUE,
  product VARCHAR(64) NOT NULL,
  unit VARCHAR(32) NOT NULL,
  rate_usd DOUBLE NOT NULL,
  time_updated_ms BIGINT NOT NULL DEFAULT 0
) ENGINE=InnoDB;

-- Pools (shared machines of one shape) and job-private collections.
CREATE TABLE instance_collections (
  name VARCHAR(100) NOT NULL PRIMARY KEY,
  is_pool BOOLEAN NOT NULL,
  provider VARCHAR(20) NOT NULL,
  worker_type VARCHAR(32) NULL,
  worker_cores INT NULL,
  worker_memory_bytes BIGINT NULL,
  preemptible BOOLEAN NOT NULL DEFAULT FALSE,
  max_instances INT NOT NULL DEFAULT 10,
  max_live_instances INT NOT NULL DEFAULT 10,
  max_new_instances_per_loop INT NOT NULL DEFAULT 2,
  enabled BOOLEAN NOT NULL DEFAULT TRUE
) ENGINE=InnoDB;

CREATE TABLE instances (
  name VARCHAR(100) NOT NULL PRIMARY KEY,
  inst_coll VARCHAR(100) NOT NULL,
  region VARCHAR(64) NOT NULL,
  machine_type VARCHAR(64) NULL,
  state ENUM('pending', 'active', 'inactive', 'deleted') NOT NULL DEFAULT 'pending',
  cores_mcpu INT NOT NULL,
  free_cores_mcpu INT NOT NULL,
  memory_bytes BIGINT NOT NULL DEFAULT 0,
  activation_token VARCHAR(100) NOT NULL,
  ip_address VARCHAR(64) NULL,
  time_created_ms BIGINT NOT NULL,
  time_activated_ms BIGINT NULL,
  time_deactivated_ms BIGINT NULL,
  last_heartbeat_ms BIGINT NULL,
  deactivation_reason VARCHAR(255) NULL,
  INDEX instances_inst_coll_state (inst_coll, state),
  CONSTRAINT instances_inst_coll FOREIGN KEY (inst_coll) REFERENCES instance_collections (name),
  CONSTRAINT instances_free_cores CHECK (free_cores_mcpu >= 0 AND free_cores_mcpu <= cores_mcpu)
) ENGINE=InnoDB;

CREATE TABLE billing_projects (
  name VARCHAR(100) NOT NULL PRIMARY KEY,
  state ENUM('open', 'closed', 'deleted') NOT NULL DEFAULT 'open',
  limit_usd DOUBLE NULL,
  time_created_ms BIGINT NOT NULL
) ENGINE=InnoDB;

CREATE TABLE billing_project_members (
  billing_project VARCHAR(100) NOT NULL,
  user VARCHAR(100) NOT NULL,
  PRIMARY KEY (billing_project, user),
  INDEX billing_project_members_user (user),
  CONSTRAINT billing_project_members_project FOREIGN KEY (billing_project) REFERENCES billing_projects (name)
) ENGINE=InnoDB;

-- Static facts about a batch, plus its rarely-changing lifecycle columns
-- (written at update creation, commit and completion only).
CREATE TABLE batches (
  batch_id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
  user VARCHAR(100) NOT NULL,
  billing_project VARCHAR(100) NOT NULL,
  idempotency_token VARCHAR(100) NULL,
  state ENUM('open', 'running', 'complete') NOT NULL DEFAULT 'open',
  n_jobs INT NOT NULL DEFAULT 0,
  n_reserved_jobs INT NOT NULL DEFAULT 0,
  n_reserved_job_groups INT NOT NULL DEFAULT 0,
  n_updates INT NOT NULL DEFAULT 0,
  callback_url VARCHAR(2048) NULL,
  time_created_ms BIGINT NOT NULL,
  time_completed_ms BIGINT NULL,
  deleted BOOLEAN NOT NULL DEFAULT FALSE,
  UNIQUE INDEX batches_user_token (user, idempotency_token),
  INDEX batches_user_state (user, state, batch_id),
  INDEX batches_billing_project_state (billing_project, state, batch_id),
  CONSTRAINT batches_billing_project FOREIGN KEY (billing_project) REFERENCES billing_projects (name)
) ENGINE=InnoDB;

CREATE TABLE batch_attributes (
  batch_id BIGINT NOT NULL,
  `key` VARCHAR(100) NOT NULL,
  `value` TEXT NULL,
  PRIMARY KEY (batch_id, `key`),
  INDEX batch_attributes_key_value (`key`, `value`(100)),
  CONSTRAINT batch_attributes_batch FOREIGN KEY (batch_id) REFERENCES batches (batch_id) ON DELETE CASCADE
) ENGINE=InnoDB;

-- One row each time a batch completes; the completion callback is sent from
-- here (an outbox), so it fires once even if the driver restarts.
CREATE TABLE batch_completions (
  batch_id BIGINT NOT NULL,
  n_jobs INT NOT NULL,
  time_completed_ms BIGINT NOT NULL,
  callback_sent_ms BIGINT NULL,
  PRIMARY KEY (batch_id, n_jobs),
  CONSTRAINT batch_completions_batch FOREIGN KEY (batch_id) REFERENCES batches (batch_id) ON DELETE CASCADE
) ENGINE=InnoDB;

-- An update reserves a contiguous block of job ids (and job group ids) so
-- several clients can insert its jobs in parallel; its jobs become visible,
-- and runnable, only when it is committed.
CREATE TABLE batch_updates (
  batch_id BIGINT NOT NULL,
  update_id INT NOT NULL,
  idempotency_token VARCHAR(100) NULL,
  start_job_id INT NOT NULL,
  n_jobs INT NOT NULL,
  start_job_group_id INT NOT NULL,
  n_job_groups INT NOT NULL,
  committed BOOLEAN NOT NULL DEFAULT FALSE,
  time_created_ms BIGINT NOT NULL,
  time_committed_ms BIGINT NULL,
  PRIMARY KEY (batch_id, update_id),
  UNIQUE INDEX batch_updates_token (batch_id, idempotency_token),
  CONSTRAINT batch_updates_batch FOREIGN KEY (batch_id) REFERENCES batches (batch_id) ON DELETE CASCADE
) ENGINE=InnoDB;

-- Job groups form a tree per batch; group 0 is the root and stands for the
-- whole batch. n_jobs counts committed jobs in the group's whole subtree.
CREATE TABLE job_groups (
  batch_id BIGINT NOT NULL,
  job_group_id INT NOT NULL,
  parent_id INT NULL,
  update_id INT NULL,
  depth INT NOT NULL,
  state ENUM('running', 'complete') NOT NULL DEFAULT 'running',
  n_jobs INT NOT NULL DEFAULT 0,
  cancel_after_n_failures INT NULL,
  time_created_ms BIGINT NOT NULL,
  time_completed_ms BIGINT NULL,
  PRIMARY KEY (batch_id, job_group_id),
  CONSTRAINT job_groups_batch FOREIGN KEY (batch_id) REFERENCES batches (batch_id) ON DELETE CASCADE,
  CONSTRAINT job_groups_depth CHECK (depth BETWEEN 0 AND 7)
) ENGINE=InnoDB;

CREATE TABLE job_group_attributes (
  batch_id BIGINT NOT NULL,
  job_group_id INT NOT NULL,
  `key` VARCHAR(100) NOT NULL,
  `value` TEXT NULL,
  PRIMARY KEY (batch_id, job_group_id, `key`),
  CONSTRAINT job_group_attributes_group FOREIGN KEY (batch_id, job_group_id)
    REFERENCES job_groups (batch_id, job_group_id) ON DELETE CASCADE
) ENGINE=InnoDB;

-- Closure table: (group, ancestor) for every ancestor including the group
-- itself. "Is this job's group cancelled?" is one indexed join, and counters
-- of every ancestor are updated in one statement.
CREATE TABLE job_group_self_and_ancestors (
  batch_id BIGINT NOT NULL,
  job_group_id INT NOT NULL,
  ancestor_id INT NOT NULL,
  level INT NOT NULL,
  PRIMARY KEY (batch_id, job_group_id, ancestor_id),
  INDEX job_group_ancestors_ancestor (batch_id, ancestor_id),
  CONSTRAINT job_group_ancestors_group FOREIGN KEY (batch_id, job_group_id)
    REFERENCES job_groups (batch_id, job_group_id) ON DELETE CASCADE
) ENGINE=InnoDB;

-- Cancellation is dynamic state in its own table: cancelling a batch (group
-- 0) or a group is one INSERT, whatever the number of jobs.
CREATE TABLE job_groups_cancelled (
  batch_id BIGINT NOT NULL,
  job_group_id INT NOT NULL,
  cancelled_by VARCHAR(100) NOT NULL,
  reason VARCHAR(1024) NOT NULL,
  time_cancelled_ms BIGINT NOT NULL,
  PRIMARY KEY (batch_id, job_group_id),
  CONSTRAINT job_groups_cancelled_group FOREIGN KEY (batch_id, job_group_id)
    REFERENCES job_groups (batch_id, job_group_id) ON DELETE CASCADE
) ENGINE=InnoDB;

-- Jobs. A job's spec lives in blob storage (spec_ref); the row holds what
-- scheduling, accounting and listing need.
--   dependency_failed: a parent ended in a state its edge does not accept;
--   the job becomes Ready but is cancelled by the canceller instead of run
--   (unless always_run), which also propagates to its own children.
CREATE TABLE jobs (
  batch_id BIGINT NOT NULL,
  job_id INT NOT NULL,
  update_id INT NOT NULL,
  job_group_id INT NOT NULL,
  state ENUM('Pending', 'Ready', 'Creating', 'Running', 'Success', 'Failed', 'Error', 'Cancelled')
    NOT NULL DEFAULT 'Pending',
  dependency_failed BOOLEAN NOT NULL DEFAULT FALSE,
  always_run BOOLEAN NOT NULL DEFAULT FALSE,
  n_pending_parents INT NOT NULL DEFAULT 0,
  cores_mcpu INT NOT NULL,
  memory_bytes BIGINT NOT NULL DEFAULT 0,
  inst_coll VARCHAR(100) NOT NULL,
  regions_bits BIGINT NULL,
  priority INT NOT NULL DEFAULT 0,
  max_attempts INT NOT NULL DEFAULT 3,
  n_attempts INT NOT NULL DEFAULT 0,
  attempt_id VARCHAR(40) NULL,
  exit_code INT NULL,
  spec_ref VARCHAR(1024) NULL,
  time_created_ms BIGINT NOT NULL,
  PRIMARY KEY (batch_id, job_id),
  INDEX jobs_update (batch_id, update_id),
  INDEX jobs_scheduling (batch_id, state, always_run, dependency_failed, inst_coll, job_group_id),
  INDEX jobs_group_state (batch_id, job_group_id, state),
  CONSTRAINT jobs_batch FOREIGN KEY (batch_id) REFERENCES batches (batch_id) ON DELETE CASCADE,
  CONSTRAINT jobs_inst_coll FOREIGN KEY (inst_coll) REFERENCES instance_collections (name),
  CONSTRAINT jobs_cores CHECK (cores_mcpu >= 0),
  CONSTRAINT jobs_pending_parents CHECK (n_pending_parents >= 0)
) ENGINE=InnoDB;

-- Dependency edges. accepted_states is a bit set of the parent final states
-- the child accepts: 1 = Success, 2 = Failed, 4 = Error, 8 = Cancelled.
-- parent_id < job_id always: the graph is acyclic by construction.
CREATE TABLE job_parents (
  batch_id BIGINT NOT NULL,
  job_id INT NOT NULL,
  parent_id INT NOT NULL,
  accepted_states TINYINT NOT NULL DEFAULT 1,
  PRIMARY KEY (batch_id, job_id, parent_id),
  INDEX job_parents_parent (batch_id, parent_id),
  CONSTRAINT job_parents_child FOREIGN KEY (batch_id, job_id) REFERENCES jobs (batch_id, job_id) ON DELETE CASCADE,
  CONSTRAINT job_parents_order CHECK (parent_id < job_id),
  CONSTRAINT job_parents_states CHECK (accepted_states BETWEEN 1 AND 15)
) ENGINE=InnoDB;

CREATE TABLE job_attributes (
  batch_id BIGINT NOT NULL,
  job_id INT NOT NULL,
  `key` VARCHAR(100) NOT NULL,
  `value` TEXT NULL,
  PRIMARY KEY (batch_id, job_id, `key`),
  INDEX job_attributes_key_value (batch_id, `key`, `value`(100)),
  CONSTRAINT job_attributes_job FOREIGN KEY (batch_id, job_id) REFERENCES jobs (batch_id, job_id) ON DELETE CASCADE
) ENGINE=InnoDB;

-- Resource locks a job declares (Ganeti's modes); names are empty for the
-- modes that name nothing (UnknownShared, AllShared, ...).
CREATE TABLE job_locks (
  batch_id BIGINT NOT NULL,
  job_id INT NOT NULL,
  level VARCHAR(64) NOT NULL,
  mode ENUM('shared', 'unknown_shared', 'all_shared', 'exclusive', 'unknown_exclusive', 'all_exclusive') NOT NULL,
  lock_name VARCHAR(255) NOT NULL DEFAULT '',
  PRIMARY KEY (batch_id, job_id, level, mode, lock_name),
  INDEX job_locks_level_name (level, lock_name),
  CONSTRAINT job_locks_job FOREIGN KEY (batch_id, job_id) REFERENCES jobs (batch_id, job_id) ON DELETE CASCADE
) ENGINE=InnoDB;

-- One row per execution of a job. rollup_time_ms advances with heartbeats
-- and at the end; usage so far = rollup_time_ms - start_time_ms.
CREATE TABLE attempts (
  batch_id BIGINT NOT NULL,
  job_id INT NOT NULL,
  attempt_id VARCHAR(40) NOT NULL,
  instance_name VARCHAR(100) NOT NULL,
  start_time_ms BIGINT NULL,
  end_time_ms BIGINT NULL,
  rollup_time_ms BIGINT NULL,
  reason VARCHAR(64) NULL,
  PRIMARY KEY (batch_id, job_id, attempt_id),
  INDEX attempts_instance (instance_name, end_time_ms),
  CONSTRAINT attempts_job FOREIGN KEY (batch_id, job_id) REFERENCES jobs (batch_id, job_id) ON DELETE CASCADE,
  CONSTRAINT attempts_times CHECK (rollup_time_ms IS NULL OR start_time_ms IS NULL OR rollup_time_ms >= start_time_ms)
) ENGINE=InnoDB;

-- What an attempt consumes per millisecond, e.g. 1000 of 'cpu/local/1'
-- (mcpu) and 4096 of 'memory/local/1' (MiB).
CREATE TABLE attempt_resources (
  batch_id BIGINT NOT NULL,
  job_id INT NOT NULL,
  attempt_id VARCHAR(40) NOT NULL,
  resource_id INT NOT NULL,
  quantity BIGINT NOT NULL,
  PRIMARY KEY (batch_id, job_id, attempt_id, resource_id),
  CONSTRAINT attempt_resources_attempt FOREIGN KEY (batch_id, job_id, attempt_id)
    REFERENCES attempts (batch_id, job_id, attempt_id) ON DELETE CASCADE,
  CONSTRAINT attempt_resources_resource FOREIGN KEY (resource_id) REFERENCES resources (resource_id),
  CONSTRAINT attempt_resources_quantity CHECK (quantity >= 0)
) ENGINE=InnoDB;

-- TOKENIZED completion counters per job group (and so per batch: group 0).
-- Every final transition of a job adds 1 to each ancestor's row for the
-- writer's token; a group is complete when SUM(n_completed) = n_jobs.
CREATE TABLE job_groups_n_jobs_in_complete_states (
  batch_id BIGINT NOT NULL,
  job_group_id INT NOT NULL,
  token TINYINT NOT NULL,
  n_completed INT NOT NULL DEFAULT 0,
  n_succeeded INT NOT NULL DEFAULT 0,
  n_failed INT NOT NULL DEFAULT 0,
  n_errored INT NOT NULL DEFAULT 0,
  n_cancelled INT NOT NULL DEFAULT 0,
  PRIMARY KEY (batch_id, job_group_id, token)
) ENGINE=InnoDB;

-- TOKENIZED live resource counts per user, instance collection, batch and
-- the job's own group (the cancellation RFC's per-batch table, keyed one
-- level finer so cancelling a group masks exactly that group's demand).
-- Ready demand is split into always-run and cancellable so fair share can
-- ignore the cancellable part of cancelled groups in O(1): cancelling never
-- touches these rows.
CREATE TABLE user_inst_coll_resources_by_job_group (
  user VARCHAR(100) NOT NULL,
  inst_coll VARCHAR(100) NOT NULL,
  batch_id BIGINT NOT NULL,
  job_group_id INT NOT NULL,
  token TINYINT NOT NULL,
  n_ready_cancellable_jobs INT NOT NULL DEFAULT 0,
  ready_cancellable_cores_mcpu BIGINT NOT NULL DEFAULT 0,
  n_ready_always_run_jobs INT NOT NULL DEFAULT 0,
  ready_always_run_cores_mcpu BIGINT NOT NULL DEFAULT 0,
  n_ready_dependency_failed_jobs INT NOT NULL DEFAULT 0,
  n_creating_jobs INT NOT NULL DEFAULT 0,
  n_creating_cancellable_jobs INT NOT NULL DEFAULT 0,
  n_running_jobs INT NOT NULL DEFAULT 0,
  running_cores_mcpu BIGINT NOT NULL DEFAULT 0,
  n_running_cancellable_jobs INT NOT NULL DEFAULT 0,
  PRIMARY KEY (user, inst_coll, batch_id, job_group_id, token),
  INDEX user_resources_batch (batch_id, job_group_id)
) ENGINE=InnoDB;

-- Billing aggregates: usage (resource units x ms) per resource. Cost is
-- SUM(usage * resources.rate_usd), a scan of a few hundred rows at most.
-- Per job (one writer at a time: not tokenized).
CREATE TABLE aggregated_job_resources (
  batch_id BIGINT NOT NULL,
  job_id INT NOT NULL,
  resource_id INT NOT NULL,
  `usage` BIGINT NOT NULL DEFAULT 0,
  PRIMARY KEY (batch_id, job_id, resource_id)
) ENGINE=InnoDB;

-- Per job group, for every ancestor; the batch's cost is group 0's.
CREATE TABLE aggregated_job_group_resources (
  batch_id BIGINT NOT NULL,
  job_group_id INT NOT NULL,
  resource_id INT NOT NULL,
  token TINYINT NOT NULL,
  `usage` BIGINT NOT NULL DEFAULT 0,
  PRIMARY KEY (batch_id, job_group_id, resource_id, token)
) ENGINE=InnoDB;

CREATE TABLE aggregated_billing_project_resources (
  billing_project VARCHAR(100) NOT NULL,
  resource_id INT NOT NULL,
  token TINYINT NOT NULL,
  `usage` BIGINT NOT NULL DEFAULT 0,
  PRIMARY KEY (billing_project, resource_id, token)
) ENGINE=InnoDB;

-- Per billing project, user and UTC day of the rollup.
CREATE TABLE aggregated_billing_project_user_resources_by_date (
  billing_date DATE NOT NULL,
  billing_project VARCHAR(100) NOT NULL,
  user VARCHAR(100) NOT NULL,
  resource_id INT NOT NULL,
  token TINYINT NOT NULL,
  `usage` BIGINT NOT NULL DEFAULT 0,
  PRIMARY KEY (billing_date, billing_project, user, resource_id, token),
  INDEX aggregated_by_date_project (billing_project, billing_date)
) ENGINE=InnoDB;

-- The batch's cost as a view over the root group, so listing needs no join
-- logic of its own.
CREATE VIEW batch_cost AS
  SELECT a.batch_id, SUM(a.`usage` * r.rate_usd) AS cost_usd
  FROM aggregated_job_group_resources a
  JOIN resources r ON r.resource_id = a.resource_id
  WHERE a.job_group_id = 0
  GROUP BY a.batch_id;
