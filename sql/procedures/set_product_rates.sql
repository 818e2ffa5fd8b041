-- The driver's price sync and price refresh (services/driver/pricing): set
-- products' rates. in_rates: [{"product", "unit", "rate_usd"}], at most 1000.
-- A product whose rate differs from its latest version's (relatively, by more
-- than 1e-9) or that has none gets a new resource, PRODUCT/N+1, which becomes
-- its latest; an equal rate changes nothing. Past attempts keep the
-- resources they started with, so a new price bills only attempts that start
-- after it.
-- in_source: 'file' (the price file shipped with corral: it never replaces a
-- price a catalogue set, only fills in and corrects other file prices), or a
-- catalogue's name ('gcp-catalog', 'azure-catalog': replaces any price).
-- in_active_products: NULL, or a JSON array of every product the deployment's
-- machines are billed to: those are marked active and every other product
-- inactive (the reservation estimate reads active ones only).
-- Not fenced by the leader epoch: every driver syncs the same file at start,
-- and the product rows, locked first, serialize them.
-- Returns one row per product whose price changed (product, resource_name,
-- rate_usd, previous_rate_usd), then the status row with n_changed.
DROP PROCEDURE IF EXISTS set_product_rates;
DELIMITER $$
CREATE PROCEDURE set_product_rates(IN in_rates JSON, IN in_source VARCHAR(32), IN in_now_ms BIGINT,
                                   IN in_active_products JSON)
proc: BEGIN
  DECLARE v_n INT;
  DECLARE v_locked INT;
  DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;

  IF in_rates IS NULL OR JSON_TYPE(in_rates) <> 'ARRAY' OR JSON_LENGTH(in_rates) > 1000 THEN
    SELECT 3 AS rc, 'rates must be a JSON array of at most 1000' AS message;
    LEAVE proc;
  END IF;
  IF in_active_products IS NOT NULL AND (JSON_TYPE(in_active_products) <> 'ARRAY'
                                         OR JSON_LENGTH(in_active_products) > 4000) THEN
    SELECT 3 AS rc, 'active products must be a JSON array of at most 4000' AS message;
    LEAVE proc;
  END IF;
  IF in_source IS NULL OR in_source NOT REGEXP '^[a-z][a-z-]{0,31}$' THEN
    SELECT 3 AS rc, 'source must be a short lower-case name' AS message;
    LEAVE proc;
  END IF;
  DROP TEMPORARY TABLE IF EXISTS tmp_product_rates;
  CREATE TEMPORARY TABLE tmp_product_rates (
    product VARCHAR(1000) NULL,
    unit VARCHAR(100) NULL,
    rate_usd DOUBLE NULL,
    previous_rate_usd DOUBLE NULL,
    previous_source VARCHAR(32) NULL,
    version INT NULL,
    changed BOOLEAN NOT NULL DEFAULT FALSE,
    UNIQUE KEY (product)
  ) ENGINE=InnoDB;
  INSERT IGNORE INTO tmp_product_rates (product, unit, rate_usd)
    SELECT jt.product, jt.unit, jt.rate_usd
    FROM JSON_TABLE(in_rates, '$[*]' COLUMNS (
      product VARCHAR(1000) PATH '$.product', unit VARCHAR(100) PATH '$.unit',
      rate_usd DOUBLE PATH '$.rate_usd')) jt
    ORDER BY jt.product;
  IF EXISTS (SELECT 1 FROM tmp_product_rates
             WHERE product IS NULL OR product NOT REGEXP '^[a-z]+/[A-Za-z0-9_./-]{1,100}$' OR product LIKE '%//%'
                OR product LIKE '%/' OR unit IS NULL OR unit NOT IN ('mcpu_ms', 'mib_ms', 'gib_ms')
                OR rate_usd IS NULL OR NOT (rate_usd >= 0) OR rate_usd > 1) THEN
    SELECT 3 AS rc, 'every rate needs a product (kind/...), a unit (mcpu_ms, mib_ms, gib_ms) and a rate_usd in [0, 1]'
      AS message;
    LEAVE proc;
  END IF;

  START TRANSACTION;
  -- Lock order: the products' latest rows in product order; a product new to both tables is serialized by
  -- the unique keys (a second driver inserting the same version waits, then fails and its call is retried).
  SELECT COUNT(*) INTO v_locked
    FROM tmp_product_rates t JOIN latest_product_versions l ON l.product = t.product
    FOR UPDATE;
  UPDATE tmp_product_rates t
    LEFT JOIN latest_product_versions l ON l.product = t.product
    LEFT JOIN resources r ON r.resource_id = l.resource_id
    SET t.previous_rate_usd = r.rate_usd, t.previous_source = l.source,
        t.version = COALESCE((SELECT MAX(o.version) FROM resources o WHERE o.product = t.product), 0) + 1;
  UPDATE tmp_product_rates
    SET changed = previous_rate_usd IS NULL
                  OR (ABS(rate_usd - previous_rate_usd) > 1e-9 * GREATEST(ABS(rate_usd), ABS(previous_rate_usd))
                      AND NOT (in_source = 'file' AND previous_source NOT IN ('file', 'migration')));
  INSERT INTO resources (name, product, version, unit, rate_usd, time_updated_ms)
    SELECT CONCAT(product, '/', version), product, version, unit, rate_usd, in_now_ms
    FROM tmp_product_rates WHERE changed ORDER BY product;
  INSERT INTO latest_product_versions (product, resource_id, active, source, time_updated_ms)
    SELECT t.product, r.resource_id, TRUE, in_source, in_now_ms
    FROM tmp_product_rates t JOIN resources r ON r.product = t.product AND r.version = t.version
    WHERE t.changed ORDER BY t.product
  ON DUPLICATE KEY UPDATE resource_id = VALUES(resource_id), source = VALUES(source),
                          time_updated_ms = VALUES(time_updated_ms);
  IF in_active_products IS NOT NULL THEN
    UPDATE latest_product_versions l
      SET l.active = l.product IN (SELECT jt.product FROM JSON_TABLE(in_active_products, '$[*]' COLUMNS (
                                     product VARCHAR(1000) PATH '$')) jt);
  END IF;
  SELECT COUNT(*) INTO v_n FROM tmp_product_rates WHERE changed;
  COMMIT;
  SELECT t.product, CONCAT(t.product, '/', t.version) AS resource_name, t.rate_usd, t.previous_rate_usd
    FROM tmp_product_rates t WHERE t.changed ORDER BY t.product;
  SELECT 0 AS rc, 'ok' AS message, v_n AS n_changed;
END $$
DELIMITER ;
