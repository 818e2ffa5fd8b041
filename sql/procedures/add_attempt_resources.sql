-- Records what each attempt consumes per millisecond. in_resources:
-- [{"batch_id", "job_id", "attempt_id", "resource": "cpu/local/1", "quantity": 1000}].
-- First write wins (a repeat is a no-op); an unknown resource name refuses
-- the whole call. Usage already rolled up is billed by the insert trigger.
DROP PROCEDURE IF EXISTS add_attempt_resources;
DELIMITER $$
CREATE PROCEDURE add_attempt_resources(IN in_epoch BIGINT, IN in_resources JSON)
proc: BEGIN
  DECLARE v_ok BOOLEAN;
  DECLARE v_unknown INT;
  DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;

  IF in_resources IS NULL OR JSON_TYPE(in_resources) <> 'ARRAY' THEN
    SELECT 3 AS rc, 'resources must be a JSON array' AS message;
    LEAVE proc;
  END IF;
  SELECT COUNT(*) INTO v_unknown
    FROM JSON_TABLE(in_resources, '$[*]' COLUMNS (resource VARCHAR(128) PATH '$.resource',
                                                   quantity BIGINT PATH '$.quantity')) jt
    LEFT JOIN resources r ON r.name = jt.resource
    WHERE r.resource_id IS NULL OR jt.quantity IS NULL OR jt.quantity < 0;
  IF v_unknown > 0 THEN
    SELECT 3 AS rc, 'unknown resource or missing/negative quantity' AS message;
    LEAVE proc;
  END IF;
  START TRANSACTION;
  CALL check_epoch(in_epoch, v_ok);
  IF NOT v_ok THEN
    ROLLBACK;
    SELECT 4 AS rc, 'stale leader epoch' AS message;
    LEAVE proc;
  END IF;
  INSERT INTO attempt_resources (batch_id, job_id, attempt_id, resource_id, quantity)
    SELECT a.batch_id, a.job_id, a.attempt_id, r.resource_id, jt.quantity
    FROM JSON_TABLE(in_resources, '$[*]' COLUMNS (batch_id BIGINT PATH '$.batch_id', job_id INT PATH '$.job_id',
                                                   attempt_id VARCHAR(40) PATH '$.attempt_id',
                                                   resource VARCHAR(128) PATH '$.resource',
                                                   quantity BIGINT PATH '$.quantity')) jt
    JOIN resources r ON r.name = jt.resource
    JOIN attempts a ON a.batch_id = jt.batch_id AND a.job_id = jt.job_id AND a.attempt_id = jt.attempt_id
    ORDER BY a.batch_id, a.job_id, a.attempt_id, r.resource_id
  ON DUPLICATE KEY UPDATE quantity = attempt_resources.quantity;
  COMMIT;
  SELECT 0 AS rc, 'ok' AS message;
END $$
DELIMITER ;
