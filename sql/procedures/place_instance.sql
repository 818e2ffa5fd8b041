-- The autoscaler records where the cloud put a machine it created: its
-- region (a region-agnostic request may land in another region than asked),
-- its machine type, and so the products its attempts are billed to. The
-- scheduler matches region-pinned jobs by this region. A machine already
-- deactivated or deleted is left as it is (rc 0: nothing to correct).
DROP PROCEDURE IF EXISTS place_instance;
DELIMITER $$
CREATE PROCEDURE place_instance(IN in_epoch BIGINT, IN in_name VARCHAR(100), IN in_region VARCHAR(64),
                                IN in_machine_type VARCHAR(64), IN in_cpu_product VARCHAR(120),
                                IN in_memory_product VARCHAR(120))
proc: BEGIN
  DECLARE v_ok BOOLEAN;
  DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;
  IF in_region IS NULL OR in_region = '' OR in_cpu_product IS NULL OR in_memory_product IS NULL THEN
    SELECT 3 AS rc, 'a placement needs a region and both products' AS message;
    LEAVE proc;
  END IF;
  START TRANSACTION;
  CALL check_epoch(in_epoch, v_ok);
  IF NOT v_ok THEN
    ROLLBACK;
    SELECT 4 AS rc, 'stale leader epoch' AS message;
    LEAVE proc;
  END IF;
  IF NOT EXISTS (SELECT 1 FROM instances WHERE name = in_name FOR UPDATE) THEN
    ROLLBACK;
    SELECT 1 AS rc, CONCAT('no instance ', in_name) AS message;
    LEAVE proc;
  END IF;
  UPDATE instances
    SET region = in_region, machine_type = COALESCE(in_machine_type, machine_type), cpu_product = in_cpu_product,
        memory_product = in_memory_product
    WHERE name = in_name AND state IN ('pending', 'active');
  COMMIT;
  SELECT 0 AS rc, 'ok' AS message;
END $$
DELIMITER ;
