-- Defaults for the embedded `corral up` on one machine: one region, the local
-- provider's pools and job-private collection, and local resource prices.
-- Operators change these rows (or add cloud ones); they are data, not schema.

INSERT INTO regions (region_id, name) VALUES (0, 'local');

INSERT INTO instance_collections
  (name, is_pool, provider, worker_type, worker_cores, worker_memory_bytes, preemptible,
   max_instances, max_live_instances, max_new_instances_per_loop)
VALUES
  ('standard', TRUE, 'local', 'standard', 2, 8589934592, FALSE, 4, 4, 2),
  ('highmem', TRUE, 'local', 'highmem', 2, 17179869184, FALSE, 2, 2, 1),
  ('highcpu', TRUE, 'local', 'highcpu', 2, 2147483648, FALSE, 2, 2, 1),
  ('job-private', FALSE, 'local', NULL, NULL, NULL, FALSE, 4, 4, 2);

-- Rates are USD per unit: cpu per mcpu-ms ($0.04 per core-hour), memory per
-- MiB-ms ($0.005 per GiB-hour), storage per GiB-ms ($0.0001 per GiB-hour).
-- The e0 makes each a DOUBLE division: as DECIMAL it would round to 0.
INSERT INTO resources (name, product, unit, rate_usd) VALUES
  ('cpu/local/1', 'cpu', 'mcpu_ms', 0.04e0 / (1000 * 3600000)),
  ('memory/local/1', 'memory', 'mib_ms', 0.005e0 / (1024 * 3600000)),
  ('storage/local/1', 'storage', 'gib_ms', 0.0001e0 / 3600000);
