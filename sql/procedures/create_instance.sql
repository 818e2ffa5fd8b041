-- The autoscaler records a machine it is about to create (state 'pending').
-- Idempotent on the name: a repeat with the same name returns rc 0.
-- in_preemptible: a spot machine; NULL means the pool's kind (migration 0014).
-- in_memory_bytes, in_storage_bytes: its memory and scratch storage (the
-- autoscaler passes its pool's machine's; NULL or 0: not known, not
-- checked there). Its worker may report its storage when it activates.
-- in_cpu_product, in_memory_product: what its attempts are billed to (its
-- machine's products, services/driver/pricing); NULL: the local provider's.
-- place_instance corrects region, machine type and products once the cloud
-- has placed it.
DROP PROCEDURE IF EXISTS create_instance;
DELIMITER $$
CREATE PROCEDURE create_instance(IN in_epoch BIGINT, IN in_name VARCHAR(100), IN in_inst_coll VARCHAR(100),
                                 IN in_region VARCHAR(64), IN in_machine_type VARCHAR(64),
                                 IN in_cores_mcpu INT, IN in_memory_bytes BIGINT,
                                 IN in_activation_token VARCHAR(100), IN in_now_ms BIGINT,
                                 IN in_preemptible BOOLEAN, IN in_storage_bytes BIGINT,
                                 IN in_cpu_product VARCHAR(120), IN in_memory_product VARCHAR(120))
proc: BEGIN
  DECLARE v_ok BOOLEAN;
  DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;
  IF in_cores_mcpu IS NULL OR in_cores_mcpu <= 0 THEN
    SELECT 3 AS rc, 'cores_mcpu must be positive' AS message;
    LEAVE proc;
  END IF;
  IF NOT EXISTS (SELECT 1 FROM instance_collections WHERE name = in_inst_coll) THEN
    SELECT 1 AS rc, CONCAT('no instance collection ', in_inst_coll) AS message;
    LEAVE proc;
  END IF;
  START TRANSACTION;
  CALL check_epoch(in_epoch, v_ok);
  IF NOT v_ok THEN
    ROLLBACK;
    SELECT 4 AS rc, 'stale leader epoch' AS message;
    LEAVE proc;
  END IF;
  INSERT INTO instances (name, inst_coll, region, machine_type, cpu_product, memory_product, state, cores_mcpu,
                         free_cores_mcpu, memory_bytes, storage_bytes, activation_token, time_created_ms, preemptible)
    VALUES (in_name, in_inst_coll, in_region, in_machine_type, COALESCE(in_cpu_product, 'cpu/local'),
            COALESCE(in_memory_product, 'memory/local'), 'pending', in_cores_mcpu, in_cores_mcpu,
            COALESCE(in_memory_bytes, 0), COALESCE(in_storage_bytes, 0), in_activation_token, in_now_ms,
            COALESCE(in_preemptible, (SELECT c.preemptible FROM instance_collections c WHERE c.name = in_inst_coll)))
  ON DUPLICATE KEY UPDATE name = instances.name;
  COMMIT;
  SELECT 0 AS rc, 'ok' AS message;
END $$
DELIMITER ;
