-- Prices by product and version (issue 16). A product is a kind of machine
-- in a region ('cpu/gcp/n2-spot/us-central1'); a resource is a product at one
-- version ('cpu/gcp/n2-spot/us-central1/3'). A changed price is a new
-- resource, never an update of a rate: an attempt keeps the resources it
-- started with, so past attempts keep their price.
ALTER TABLE resources ADD COLUMN version INT NULL AFTER product;
-- Every name so far is PRODUCT/VERSION ('cpu/local/1'): the product is what
-- precedes the last '/'. A name without a numeric version is its own
-- product at version 0.
UPDATE resources
  SET product = IF(SUBSTRING_INDEX(name, '/', -1) REGEXP '^[0-9]+$' AND LOCATE('/', name) > 0,
                   LEFT(name, CHAR_LENGTH(name) - CHAR_LENGTH(SUBSTRING_INDEX(name, '/', -1)) - 1), name),
      version = IF(SUBSTRING_INDEX(name, '/', -1) REGEXP '^[0-9]+$' AND LOCATE('/', name) > 0,
                   CAST(SUBSTRING_INDEX(name, '/', -1) AS UNSIGNED), 0);
ALTER TABLE resources
  MODIFY product VARCHAR(120) NOT NULL,
  MODIFY version INT NOT NULL,
  ADD UNIQUE KEY resources_product_version (product, version);

-- The version in force of each product: what a starting attempt is given.
-- active: a product of the deployment's provider (the driver's price sync
-- sets it); the reservation of a job with a limited billing project is
-- priced at the dearest active product (view reservation_rates).
-- source: where the rate came from ('file', 'gcp-catalog', 'azure-catalog',
-- 'migration'); a catalogue's price is never replaced by the price file's.
CREATE TABLE latest_product_versions (
  product VARCHAR(120) NOT NULL PRIMARY KEY,
  resource_id INT NOT NULL,
  active BOOLEAN NOT NULL DEFAULT TRUE,
  source VARCHAR(32) NOT NULL,
  time_updated_ms BIGINT NOT NULL,
  CONSTRAINT latest_product_versions_resource FOREIGN KEY (resource_id) REFERENCES resources (resource_id)
) ENGINE=InnoDB;
INSERT INTO latest_product_versions (product, resource_id, active, source, time_updated_ms)
  SELECT r.product, r.resource_id, TRUE, 'migration', r.time_updated_ms
  FROM resources r
  WHERE r.version = (SELECT MAX(o.version) FROM resources o WHERE o.product = r.product);

-- What an instance's attempts are billed to: its machine's products, set when
-- the instance is created and again where the cloud placed it.
ALTER TABLE instances
  ADD COLUMN cpu_product VARCHAR(120) NOT NULL DEFAULT 'cpu/local' AFTER machine_type,
  ADD COLUMN memory_product VARCHAR(120) NOT NULL DEFAULT 'memory/local' AFTER cpu_product;

-- The rates a reservation is priced at (schedule_jobs, cancel_unaffordable_jobs, the planner): the dearest
-- active cpu and memory products, since a job may land on any of them.
CREATE VIEW reservation_rates AS
  SELECT COALESCE(MAX(IF(l.product LIKE 'cpu/%', r.rate_usd, NULL)), 0) AS cpu_rate_usd,
         COALESCE(MAX(IF(l.product LIKE 'memory/%', r.rate_usd, NULL)), 0) AS memory_rate_usd
  FROM latest_product_versions l JOIN resources r ON r.resource_id = l.resource_id
  WHERE l.active;
