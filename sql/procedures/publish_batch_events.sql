-- The publisher (the leading driver's EventPublisher loop): moves up to
-- in_max_events committed rows of batch_event_outbox, oldest first, into
-- batch_events, numbering each batch's events on from its
-- batch_event_sequences row, and deletes what it moved, in one transaction.
--
-- Rows of producers' transactions that are still open are locked by them
-- and skipped (SKIP LOCKED, MariaDB 10.6+ and MySQL 8): they are moved by a
-- later call, so a late commit is never lost, and the publisher never waits
-- for a producer. Skipping cannot reorder one job's events: a job's next
-- change needs the job row, which the transaction of its previous change
-- holds until it commits, so the previous event is committed, and taken
-- first, by then. Likewise batch_completed is appended after every job's
-- final change committed.
--
-- With in_cost_interval_ms set, it also appends a cost_accrued event for
-- each running batch whose cost (as view batch_cost computes it) grew since
-- its last one, at most once per in_cost_interval_ms per batch. That pass
-- reads every running batch: the loop asks for it every few seconds only.
--
-- Fenced by the leader epoch; the batch_event_publisher row serializes
-- publishers (see 0005_batch_events.sql). Returns the status row with
-- n_published (outbox rows moved) and n_cost_events.
DROP PROCEDURE IF EXISTS publish_batch_events;
DELIMITER $$
CREATE PROCEDURE publish_batch_events(IN in_epoch BIGINT, IN in_max_events INT, IN in_cost_interval_ms BIGINT,
                                      IN in_now_ms BIGINT)
proc: BEGIN
  DECLARE v_ok BOOLEAN;
  DECLARE v_locked INT;
  DECLARE v_n INT DEFAULT 0;
  DECLARE v_n_cost INT DEFAULT 0;
  DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;

  IF in_max_events IS NULL OR in_max_events < 1 THEN
    SELECT 3 AS rc, 'max_events must be at least 1' AS message;
    LEAVE proc;
  END IF;
  IF in_cost_interval_ms IS NOT NULL AND in_cost_interval_ms < 0 THEN
    SELECT 3 AS rc, 'cost_interval_ms must not be negative' AS message;
    LEAVE proc;
  END IF;
  IF @@in_transaction = 0 AND @corral_scratch_publish <=> '02768854ce81' THEN
    TRUNCATE TABLE tmp_publish;
    TRUNCATE TABLE tmp_costs;
  ELSE
    SET @corral_scratch_publish = NULL;
    DROP TEMPORARY TABLE IF EXISTS tmp_publish;
    CREATE TEMPORARY TABLE tmp_publish (
      seq BIGINT NOT NULL PRIMARY KEY,
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
    );
    DROP TEMPORARY TABLE IF EXISTS tmp_costs;
    CREATE TEMPORARY TABLE tmp_costs (
      batch_id BIGINT NOT NULL PRIMARY KEY,
      cost_micro_usd BIGINT NOT NULL,
      delta_micro_usd BIGINT NOT NULL
    );
    SET @corral_scratch_publish = '02768854ce81';
  END IF;

  START TRANSACTION;
  CALL check_epoch(in_epoch, v_ok);
  IF NOT v_ok THEN
    ROLLBACK;
    SELECT 4 AS rc, 'stale leader epoch' AS message;
    LEAVE proc;
  END IF;
  SELECT singleton INTO v_locked FROM batch_event_publisher WHERE singleton = 1 FOR UPDATE;

  -- The locking read copies each row it takes: the numbering and the move
  -- below read only that copy. A consistent read of the outbox could miss a
  -- row the locking read took (its producer's commit not yet visible to the
  -- read view), and the row would be numbered, not moved, and deleted: a
  -- gap and a lost event (seen under load, twice, with two earlier shapes of
  -- this procedure).
  INSERT INTO tmp_publish (seq, batch_id, kind, job_id, job_group_id, attempt_id, old_state, new_state, exit_code, update_id,
         start_job_id, n_jobs, n_succeeded, n_failed, n_errored, n_cancelled, cancelled, cancelled_by, reason,
         cost_micro_usd, delta_micro_usd, time_ms)
    SELECT seq, batch_id, kind, job_id, job_group_id, attempt_id, old_state, new_state, exit_code, update_id,
         start_job_id, n_jobs, n_succeeded, n_failed, n_errored, n_cancelled, cancelled, cancelled_by, reason,
         cost_micro_usd, delta_micro_usd, time_ms
    FROM batch_event_outbox ORDER BY seq LIMIT in_max_events FOR UPDATE SKIP LOCKED;
  SELECT COUNT(*) INTO v_n FROM tmp_publish;
  IF v_n > 0 THEN
    INSERT INTO batch_event_sequences (batch_id)
      SELECT DISTINCT batch_id FROM tmp_publish ORDER BY batch_id
    ON DUPLICATE KEY UPDATE batch_id = batch_event_sequences.batch_id;
    INSERT INTO batch_events
        (batch_id, event_id, kind, job_id, job_group_id, attempt_id, old_state, new_state, exit_code, update_id,
         start_job_id, n_jobs, n_succeeded, n_failed, n_errored, n_cancelled, cancelled, cancelled_by, reason,
         cost_micro_usd, delta_micro_usd, time_ms)
      SELECT t.batch_id, s.last_event_id + ROW_NUMBER() OVER (PARTITION BY t.batch_id ORDER BY t.seq),
             t.kind, t.job_id, t.job_group_id, t.attempt_id, t.old_state, t.new_state, t.exit_code, t.update_id,
             t.start_job_id, t.n_jobs, t.n_succeeded, t.n_failed, t.n_errored, t.n_cancelled, t.cancelled,
             t.cancelled_by, t.reason, t.cost_micro_usd, t.delta_micro_usd, t.time_ms
      FROM tmp_publish t
      JOIN batch_event_sequences s ON s.batch_id = t.batch_id;
    UPDATE batch_event_sequences s
      JOIN (SELECT batch_id, COUNT(*) AS n FROM tmp_publish GROUP BY batch_id) x ON x.batch_id = s.batch_id
      SET s.last_event_id = s.last_event_id + x.n;
    DELETE o FROM batch_event_outbox o JOIN tmp_publish t ON t.seq = o.seq;
  END IF;

  IF in_cost_interval_ms IS NOT NULL THEN
    -- The cost of batch_cost, computed per running batch with a primary-key
    -- read of its root group's rows: joined to the view, MariaDB would
    -- aggregate every batch's rows first.
    INSERT INTO tmp_costs (batch_id, cost_micro_usd, delta_micro_usd)
      SELECT x.batch_id, x.cost_micro_usd, x.cost_micro_usd - x.last_cost_micro_usd
      FROM (SELECT b.batch_id, COALESCE(s.last_cost_micro_usd, 0) AS last_cost_micro_usd,
                   (SELECT COALESCE(ROUND(SUM(a.`usage` * r.rate_usd) * 1000000), 0)
                    FROM aggregated_job_group_resources a JOIN resources r ON r.resource_id = a.resource_id
                    WHERE a.batch_id = b.batch_id AND a.job_group_id = 0) AS cost_micro_usd
            FROM batches b
            LEFT JOIN batch_event_sequences s ON s.batch_id = b.batch_id
            WHERE b.state = 'running'
              AND (s.last_cost_event_ms IS NULL OR s.last_cost_event_ms <= in_now_ms - in_cost_interval_ms)) x
      WHERE x.cost_micro_usd > x.last_cost_micro_usd;
    SELECT COUNT(*) INTO v_n_cost FROM tmp_costs;
    IF v_n_cost > 0 THEN
      INSERT INTO batch_event_sequences (batch_id)
        SELECT batch_id FROM tmp_costs ORDER BY batch_id
      ON DUPLICATE KEY UPDATE batch_id = batch_event_sequences.batch_id;
      INSERT INTO batch_events (batch_id, event_id, kind, cost_micro_usd, delta_micro_usd, time_ms)
        SELECT c.batch_id, s.last_event_id + 1, 'cost_accrued', c.cost_micro_usd, c.delta_micro_usd, in_now_ms
        FROM tmp_costs c JOIN batch_event_sequences s ON s.batch_id = c.batch_id;
      UPDATE batch_event_sequences s
        JOIN tmp_costs c ON c.batch_id = s.batch_id
        SET s.last_event_id = s.last_event_id + 1, s.last_cost_micro_usd = c.cost_micro_usd,
            s.last_cost_event_ms = in_now_ms;
    END IF;
  END IF;

  IF v_n + v_n_cost > 0 THEN
    UPDATE batch_event_publisher
      SET n_published = n_published + v_n + v_n_cost, last_published_ms = in_now_ms
      WHERE singleton = 1;
  END IF;
  COMMIT;
  SELECT 0 AS rc, 'ok' AS message, v_n AS n_published, v_n_cost AS n_cost_events;
END $$
DELIMITER ;
