-- A cloud deployment's driver makes sure every region its provider is
-- configured with is in `regions`, so that jobs may name it and its
-- machines are matched to them (the driver calls it at start). in_names: a
-- JSON array of region names, at most 63. A name already there keeps its
-- region_id (jobs store regions as bits of it); a new one takes the lowest
-- free id. Rows are never removed here: a region jobs name stays known.
-- The names' order is the cloud's preference: each given name's
-- `preference` is its position (its first), every other region's NULL.
-- rc 3: bad names, or more regions than the 63 bits jobs can name.
DROP PROCEDURE IF EXISTS add_regions;
DELIMITER $$
CREATE PROCEDURE add_regions(IN in_names JSON)
proc: BEGIN
  DECLARE v_name VARCHAR(64);
  DECLARE v_done BOOLEAN DEFAULT FALSE;
  DECLARE v_free INT;
  DECLARE v_added INT DEFAULT 0;
  DECLARE new_names CURSOR FOR
    SELECT DISTINCT jt.name FROM JSON_TABLE(in_names, '$[*]' COLUMNS (name VARCHAR(64) PATH '$')) jt
    WHERE NOT EXISTS (SELECT 1 FROM regions r WHERE r.name = jt.name) ORDER BY jt.name;
  DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_done = TRUE;
  DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;

  IF in_names IS NULL OR JSON_TYPE(in_names) <> 'ARRAY' OR JSON_LENGTH(in_names) > 63 THEN
    SELECT 3 AS rc, 'names must be a JSON array of at most 63' AS message;
    LEAVE proc;
  END IF;
  IF EXISTS (SELECT 1 FROM JSON_TABLE(in_names, '$[*]' COLUMNS (name VARCHAR(100) PATH '$')) jt
             WHERE jt.name IS NULL OR jt.name NOT REGEXP '^[a-z][a-z0-9-]{0,62}$') THEN
    SELECT 3 AS rc, 'a region name is lower-case letters, digits and -, at most 63' AS message;
    LEAVE proc;
  END IF;
  START TRANSACTION;
  SELECT COUNT(*) INTO v_free FROM regions FOR UPDATE;  -- one writer at a time
  OPEN new_names;
  add_loop: LOOP
    FETCH new_names INTO v_name;
    IF v_done THEN
      LEAVE add_loop;
    END IF;
    SET v_free = (SELECT MIN(ids.id) FROM (SELECT 0 AS id UNION ALL SELECT region_id + 1 FROM regions) ids
                  WHERE ids.id NOT IN (SELECT region_id FROM regions));
    IF v_free IS NULL OR v_free > 62 THEN
      CLOSE new_names;
      ROLLBACK;
      SELECT 3 AS rc, 'no free region id: jobs can name at most 63 regions' AS message;
      LEAVE proc;
    END IF;
    INSERT INTO regions (region_id, name) VALUES (v_free, v_name);
    SET v_added = v_added + 1;
  END LOOP;
  CLOSE new_names;
  UPDATE regions r
  LEFT JOIN (SELECT jt.name, MIN(jt.position) - 1 AS preference
             FROM JSON_TABLE(in_names, '$[*]' COLUMNS (position FOR ORDINALITY, name VARCHAR(64) PATH '$')) jt
             GROUP BY jt.name) given ON given.name = r.name
  SET r.preference = given.preference;
  COMMIT;
  SELECT 0 AS rc, 'ok' AS message, v_added AS n_added;
END $$
DELIMITER ;
