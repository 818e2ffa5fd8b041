-- MJS, bulk: a worker reports that attempts began running at start_time_ms.
-- in_jobs: [{"batch_id", "job_id", "attempt_id", "start_time_ms", "isolation",
-- "image_digest", "cpu_resource", "memory_resource", "instance_name"}] for
-- attempts on the row's instance_name, or in_instance_name where a row names
-- none (the driver records the starts of all its workers' sessions in one
-- call); an attempt named twice counts once, by its first row. Sets the attempt's start (and
-- the billing rollup origin), the runtime's words on its isolation and the
-- digest of the image it runs (migration 0025), once. A digest that is not
-- `sha256:` and 64 lowercase hex digits (or none: the process runtime pulls
-- no image) is recorded as NULL.
-- The job's state is not touched: SJ already made it Running.
-- A started or already started attempt is also given what it uses per
-- millisecond, as add_attempt_resources would, in the same transaction: the
-- job's cores_mcpu of its cpu resource, its memory_bytes in MiB of its
-- memory resource; first write wins. A row's cpu_resource / memory_resource
-- name them (resources.name; either may be left out). With
-- in_instance_products (the driver), one a row leaves out is its instance's
-- product (instances.cpu_product, memory_product) at its latest version: the
-- price in force as the attempt starts (migration 0023). An unknown name
-- refuses the whole call (rc 3). One call instead of a read of the jobs'
-- sizes and a second call.
-- Returns one row per job (batch_id, job_id, attempt_id, outcome), then the
-- status row with n_started:
--   started           the start is recorded now
--   already_started   a repeat: nothing changes
--   cancelled         the job's group or an ancestor is cancelled and the job
--                     is not always_run: no start is recorded, and the driver
--                     tells the worker to stop the attempt at once (so a Run
--                     command in flight when the batch was cancelled does not
--                     run on)
--   already_complete  the job is final (by another attempt's report) while
--                     this attempt is open: no start, the driver stops it
--   ended             the attempt was closed (MJC came first, or its instance
--                     was deactivated): nothing changes
--   not_found         no such attempt on the row's instance
-- Checked in the order not_found, ended, already_complete, cancelled,
-- already_started, started: the first that applies is the outcome.
-- Lock order: jobs (shared, ascending), then attempts (ascending). The
-- shared job locks make MJS wait for an MJC of the same job in flight, so it
-- never records a start on a job that just became final.
DROP PROCEDURE IF EXISTS mark_jobs_started;
DELIMITER $$
CREATE PROCEDURE mark_jobs_started(IN in_epoch BIGINT, IN in_instance_name VARCHAR(100), IN in_jobs JSON,
                                   IN in_instance_products BOOLEAN)
proc: BEGIN
  DECLARE v_ok BOOLEAN;
  DECLARE v_n INT;
  DECLARE v_locked INT;
  DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN
    SET @corral_bulk_usage = NULL;
    ROLLBACK;
    RESIGNAL;
  END;

  IF in_jobs IS NULL OR JSON_TYPE(in_jobs) <> 'ARRAY' THEN
    SELECT 3 AS rc, 'jobs must be a JSON array' AS message;
    LEAVE proc;
  END IF;
  -- Made once per connection, emptied by TRUNCATE (see create_completion_tables). Rows go in
  -- sorted, and a scan follows insertion (the hidden row id), so the locking reads below take rows
  -- in key order.
  IF @@in_transaction = 0 AND @corral_scratch_job_starts <=> 'dad9b74d1d80' THEN
    TRUNCATE TABLE tmp_job_starts;
  ELSE
    SET @corral_scratch_job_starts = NULL;
    DROP TEMPORARY TABLE IF EXISTS tmp_job_starts;
    CREATE TEMPORARY TABLE tmp_job_starts (
      batch_id BIGINT NULL,
      job_id INT NULL,
      attempt_id VARCHAR(40) NULL,
      instance_name VARCHAR(100) NULL,
      start_time_ms BIGINT NULL,
      isolation VARCHAR(512) NULL,
      image_digest CHAR(71) CHARACTER SET ascii COLLATE ascii_bin NULL,
      cpu_resource VARCHAR(128) NULL,
      memory_resource VARCHAR(128) NULL,
      outcome VARCHAR(32) NULL,
      UNIQUE KEY (batch_id, job_id, attempt_id)
    ) ENGINE=InnoDB;
    SET @corral_scratch_job_starts = 'dad9b74d1d80';
  END IF;
  -- A repeat of the same attempt in one call is recorded once.
  INSERT IGNORE INTO tmp_job_starts (batch_id, job_id, attempt_id, instance_name, start_time_ms, isolation,
                                     image_digest, cpu_resource, memory_resource)
    SELECT jt.batch_id, jt.job_id, jt.attempt_id, COALESCE(jt.instance_name, in_instance_name), jt.start_time_ms,
           LEFT(jt.isolation, 512),
           -- (PCRE's $ also matches before a final newline: the length rules that out.)
           IF(CHAR_LENGTH(jt.image_digest) = 71 AND jt.image_digest REGEXP '(?-i)^sha256:[0-9a-f]{64}$',
              jt.image_digest, NULL),
           jt.cpu_resource, jt.memory_resource
    FROM JSON_TABLE(in_jobs, '$[*]' COLUMNS (
      batch_id BIGINT PATH '$.batch_id', job_id INT PATH '$.job_id', attempt_id VARCHAR(40) PATH '$.attempt_id',
      instance_name VARCHAR(100) PATH '$.instance_name',
      start_time_ms BIGINT PATH '$.start_time_ms', isolation TEXT PATH '$.isolation',
      image_digest TEXT PATH '$.image_digest',
      cpu_resource VARCHAR(128) PATH '$.cpu_resource', memory_resource VARCHAR(128) PATH '$.memory_resource')) jt
    ORDER BY jt.batch_id, jt.job_id, jt.attempt_id;
  IF EXISTS (SELECT 1 FROM tmp_job_starts
             WHERE batch_id IS NULL OR job_id IS NULL OR attempt_id IS NULL OR start_time_ms IS NULL) THEN
    SELECT 3 AS rc, 'every job needs batch_id, job_id, attempt_id and start_time_ms' AS message;
    LEAVE proc;
  END IF;
  IF EXISTS (SELECT 1 FROM tmp_job_starts t
             WHERE (t.cpu_resource IS NOT NULL AND NOT EXISTS (SELECT 1 FROM resources r WHERE r.name = t.cpu_resource))
                OR (t.memory_resource IS NOT NULL
                    AND NOT EXISTS (SELECT 1 FROM resources r WHERE r.name = t.memory_resource))) THEN
    SELECT 3 AS rc, 'unknown cpu_resource or memory_resource' AS message;
    LEAVE proc;
  END IF;

  -- What a row does not name: its instance's products at their latest versions (NULL for an unknown
  -- instance or an unpriced product).
  IF in_instance_products THEN
    UPDATE tmp_job_starts t
      JOIN instances i ON i.name = t.instance_name
      SET t.cpu_resource = COALESCE(t.cpu_resource, (
            SELECT r.name FROM latest_product_versions l JOIN resources r ON r.resource_id = l.resource_id
            WHERE l.product = i.cpu_product)),
          t.memory_resource = COALESCE(t.memory_resource, (
            SELECT r.name FROM latest_product_versions l JOIN resources r ON r.resource_id = l.resource_id
            WHERE l.product = i.memory_product));
  END IF;

  START TRANSACTION;
  CALL check_epoch(in_epoch, v_ok);
  IF NOT v_ok THEN
    ROLLBACK;
    SELECT 4 AS rc, 'stale leader epoch' AS message;
    LEAVE proc;
  END IF;
  SELECT COUNT(*) INTO v_locked
    FROM tmp_job_starts t JOIN jobs j ON j.batch_id = t.batch_id AND j.job_id = t.job_id
    LOCK IN SHARE MODE;
  SELECT COUNT(*) INTO v_locked
    FROM tmp_job_starts t
    JOIN attempts a ON a.batch_id = t.batch_id AND a.job_id = t.job_id AND a.attempt_id = t.attempt_id
    FOR UPDATE;

  UPDATE tmp_job_starts t
    LEFT JOIN jobs j ON j.batch_id = t.batch_id AND j.job_id = t.job_id
    LEFT JOIN attempts a ON a.batch_id = t.batch_id AND a.job_id = t.job_id AND a.attempt_id = t.attempt_id
                        AND a.instance_name = t.instance_name
    SET t.outcome = CASE
      WHEN j.job_id IS NULL OR a.attempt_id IS NULL THEN 'not_found'
      WHEN a.end_time_ms IS NOT NULL THEN 'ended'
      WHEN j.state IN ('Success', 'Failed', 'Error', 'Cancelled') THEN 'already_complete'
      WHEN NOT j.always_run AND EXISTS (SELECT 1 FROM job_groups_cancelled_self_or_ancestor x
                                        WHERE x.batch_id = j.batch_id AND x.job_group_id = j.job_group_id)
        THEN 'cancelled'
      WHEN a.start_time_ms IS NOT NULL THEN 'already_started'
      ELSE 'started' END;

  -- A start sets the attempt's start and rollup together (no MJC has set a rollup: it would have ended the
  -- attempt), so it bills nothing, and neither does a resource recorded now: the billing triggers are
  -- skipped for these rows (@corral_bulk_usage), as MJC and heartbeat_rollup skip them for theirs.
  SET @corral_bulk_usage = 1;
  UPDATE attempts a
    JOIN tmp_job_starts t ON a.batch_id = t.batch_id AND a.job_id = t.job_id AND a.attempt_id = t.attempt_id
    SET a.rollup_time_ms = COALESCE(a.rollup_time_ms, t.start_time_ms),
        a.start_time_ms = t.start_time_ms,
        a.isolation = t.isolation,
        a.image_digest = t.image_digest
    WHERE t.outcome = 'started';
  -- Sorted as the locks above: the attempts' rows, then each one's resources by id.
  INSERT INTO attempt_resources (batch_id, job_id, attempt_id, resource_id, quantity)
    SELECT t.batch_id, t.job_id, t.attempt_id, r.resource_id,
           IF(r.name = t.cpu_resource, j.cores_mcpu, j.memory_bytes DIV 1048576)
    FROM tmp_job_starts t
    JOIN jobs j ON j.batch_id = t.batch_id AND j.job_id = t.job_id
    JOIN resources r ON r.name IN (t.cpu_resource,
                                   t.memory_resource)
    WHERE t.outcome = 'started'
    ORDER BY t.batch_id, t.job_id, t.attempt_id, r.resource_id
  ON DUPLICATE KEY UPDATE quantity = attempt_resources.quantity;
  SET @corral_bulk_usage = NULL;
  -- A repeated start may record resources for the first time (a caller that gave none before): what its
  -- heartbeats rolled up since is billed by the insert trigger.
  INSERT INTO attempt_resources (batch_id, job_id, attempt_id, resource_id, quantity)
    SELECT t.batch_id, t.job_id, t.attempt_id, r.resource_id,
           IF(r.name = t.cpu_resource, j.cores_mcpu, j.memory_bytes DIV 1048576)
    FROM tmp_job_starts t
    JOIN jobs j ON j.batch_id = t.batch_id AND j.job_id = t.job_id
    JOIN resources r ON r.name IN (t.cpu_resource,
                                   t.memory_resource)
    WHERE t.outcome = 'already_started'
    ORDER BY t.batch_id, t.job_id, t.attempt_id, r.resource_id
  ON DUPLICATE KEY UPDATE quantity = attempt_resources.quantity;
  SELECT COUNT(*) INTO v_n FROM tmp_job_starts WHERE outcome = 'started';
  COMMIT;
  SELECT batch_id, job_id, attempt_id, outcome FROM tmp_job_starts ORDER BY batch_id, job_id, attempt_id;
  SELECT 0 AS rc, 'ok' AS message, v_n AS n_started;
END $$
DELIMITER ;
