-- The batch event log behind WatchBatch (docs/architecture.md, "Events").
--
-- Producers never number events: a per-batch counter written by every state
-- change would serialize all completions of a batch on one row (what the
-- tokenized counters avoid), and a global AUTO_INCREMENT read by a cursor
-- loses events, because transactions commit out of id order. Instead:
--   * producers append to batch_event_outbox (the jobs trigger, commit_update,
--     check_completions, the job_groups_cancelled trigger): an insert at the
--     end of an AUTO_INCREMENT key, no lock on anything another producer
--     holds;
--   * one publisher, the leading driver (publish_batch_events), moves
--     committed outbox rows into batch_events, giving each batch the next
--     contiguous ids from batch_event_sequences, and deletes what it moved,
--     in one transaction. Rows of transactions still open are skipped (SKIP
--     LOCKED) and moved by a later call: consumed by deletion, not read by a
--     cursor, a late commit is never lost.
-- Lock order of the publisher: leader_epoch (shared) -> batch_event_publisher
-- -> outbox rows -> batch_event_sequences -> batch_events. Producers only
-- insert outbox rows, so the two never wait for each other.
--
-- No foreign keys, as for the counter tables: a foreign-key check would
-- share-lock the batch row on every event. Rows go with their batch through
-- the cleanup procedure.

-- What happened, before it has an id. Columns not relevant to a kind are NULL:
--   job_state_changed  job_id, job_group_id, attempt_id, old_state, new_state, exit_code
--   update_committed   update_id, start_job_id, n_jobs
--   cancelled          job_group_id, cancelled_by, reason (time_ms = when)
--   batch_completed    n_jobs, n_succeeded, n_failed, n_errored, n_cancelled,
--                      cancelled, cost_micro_usd
--   cost_accrued       cost_micro_usd, delta_micro_usd (written by the
--                      publisher straight into batch_events)
CREATE TABLE batch_event_outbox (
  seq BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
  batch_id BIGINT NOT NULL,
  kind ENUM('job_state_changed', 'update_committed', 'cancelled', 'batch_completed', 'cost_accrued') NOT NULL,
  job_id INT NULL,
  job_group_id INT NULL,
  attempt_id VARCHAR(40) NULL,
  old_state ENUM('Pending', 'Ready', 'Creating', 'Running', 'Success', 'Failed', 'Error', 'Cancelled') NULL,
  new_state ENUM('Pending', 'Ready', 'Creating', 'Running', 'Success', 'Failed', 'Error', 'Cancelled') NULL,
  exit_code INT NULL,
  update_id INT NULL,
  start_job_id INT NULL,
  n_jobs INT NULL,
  n_succeeded INT NULL,
  n_failed INT NULL,
  n_errored INT NULL,
  n_cancelled INT NULL,
  cancelled BOOLEAN NULL,
  cancelled_by VARCHAR(100) NULL,
  reason VARCHAR(1024) NULL,
  cost_micro_usd BIGINT NULL,
  delta_micro_usd BIGINT NULL,
  time_ms BIGINT NOT NULL
) ENGINE=InnoDB;

-- The published log: per batch, event ids 1, 2, ... without gaps, in an
-- order consistent with causality (each job's changes in the order they
-- happened; BatchCompleted after every job's final change).
CREATE TABLE batch_events (
  batch_id BIGINT NOT NULL,
  event_id BIGINT NOT NULL,
  kind ENUM('job_state_changed', 'update_committed', 'cancelled', 'batch_completed', 'cost_accrued') NOT NULL,
  job_id INT NULL,
  job_group_id INT NULL,
  attempt_id VARCHAR(40) NULL,
  old_state ENUM('Pending', 'Ready', 'Creating', 'Running', 'Success', 'Failed', 'Error', 'Cancelled') NULL,
  new_state ENUM('Pending', 'Ready', 'Creating', 'Running', 'Success', 'Failed', 'Error', 'Cancelled') NULL,
  exit_code INT NULL,
  update_id INT NULL,
  start_job_id INT NULL,
  n_jobs INT NULL,
  n_succeeded INT NULL,
  n_failed INT NULL,
  n_errored INT NULL,
  n_cancelled INT NULL,
  cancelled BOOLEAN NULL,
  cancelled_by VARCHAR(100) NULL,
  reason VARCHAR(1024) NULL,
  cost_micro_usd BIGINT NULL,
  delta_micro_usd BIGINT NULL,
  time_ms BIGINT NOT NULL,
  PRIMARY KEY (batch_id, event_id)
) ENGINE=InnoDB;

-- Written only by the publisher: the last id given out per batch (GetBatch's
-- last_event_id), and the cost last reported in a cost_accrued event.
CREATE TABLE batch_event_sequences (
  batch_id BIGINT NOT NULL PRIMARY KEY,
  last_event_id BIGINT NOT NULL DEFAULT 0,
  last_cost_micro_usd BIGINT NOT NULL DEFAULT 0,
  last_cost_event_ms BIGINT NULL
) ENGINE=InnoDB;

-- One row the publisher locks first, so that two publish calls (a leader's
-- loop and a stray manual call) never interleave their ids: with SKIP LOCKED
-- a second caller would otherwise take later outbox rows and number them
-- before the first caller's earlier ones.
CREATE TABLE batch_event_publisher (
  singleton TINYINT NOT NULL PRIMARY KEY DEFAULT 1,
  n_published BIGINT NOT NULL DEFAULT 0,
  last_published_ms BIGINT NULL,
  CONSTRAINT batch_event_publisher_single_row CHECK (singleton = 1)
) ENGINE=InnoDB;

INSERT INTO batch_event_publisher (singleton) VALUES (1);
