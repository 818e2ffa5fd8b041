-- A new machine's worker exchanges its one-time activation token for its
-- certificate (issue 16): the token is accepted once, while the instance is
-- pending (a deactivated or deleted instance's token is revoked with it),
-- and within in_token_ttl_ms of the instance's creation. One conditional
-- UPDATE decides and consumes, so of two concurrent calls with the same
-- token exactly one succeeds.
-- rc 6 says only that the token was refused, whatever the reason (wrong,
-- used, expired, another instance's, revoked): the caller learns nothing
-- about which instances exist or what state they are in.
-- No leader epoch: enrolling signs a certificate and changes no scheduling
-- state; any driver may answer (the gateway sends it to the leader).
DROP PROCEDURE IF EXISTS enroll_instance;
DELIMITER $$
CREATE PROCEDURE enroll_instance(IN in_name VARCHAR(100), IN in_activation_token VARCHAR(100), IN in_now_ms BIGINT,
                                 IN in_token_ttl_ms BIGINT)
proc: BEGIN
  DECLARE v_enrolled INT;
  DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;
  START TRANSACTION;
  -- BINARY: the column's collation pads spaces, so 'token ' would equal 'token'.
  UPDATE instances
    SET time_enrolled_ms = in_now_ms
    WHERE name = in_name AND BINARY activation_token = BINARY in_activation_token AND state = 'pending'
      AND time_enrolled_ms IS NULL AND in_now_ms - time_created_ms < in_token_ttl_ms;
  SET v_enrolled = ROW_COUNT();
  COMMIT;
  IF v_enrolled = 1 THEN
    SELECT 0 AS rc, 'ok' AS message;
  ELSE
    SELECT 6 AS rc, 'activation token refused' AS message;
  END IF;
END $$
DELIMITER ;
