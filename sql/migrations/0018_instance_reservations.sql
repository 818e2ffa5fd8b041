-- What an instance's open attempts reserve of its memory and scratch
-- storage, kept beside free_cores_mcpu by the same statements (issue 11,
-- acceptance 6): schedule_jobs adds a started job's memory and storage,
-- complete_jobs_core gives them back when its attempt ends, and a
-- deactivated instance holds nothing. The scheduler reads the instances'
-- free memory and storage from these columns instead of summing every
-- open attempt's job each cycle (16 ms on the fair-share benchmark's
-- 15,000 running jobs). services/db/invariants.py recomputes them as it
-- does free_cores_mcpu.
ALTER TABLE instances
  ADD COLUMN used_memory_bytes BIGINT NOT NULL DEFAULT 0 AFTER memory_bytes,
  ADD COLUMN used_storage_bytes BIGINT NOT NULL DEFAULT 0 AFTER storage_bytes;

UPDATE instances i
  JOIN (SELECT a.instance_name, SUM(COALESCE(j.memory_bytes, 0)) AS memory_bytes,
               SUM(j.storage_bytes) AS storage_bytes
        FROM attempts a
        JOIN jobs j ON j.batch_id = a.batch_id AND j.job_id = a.job_id AND j.attempt_id = a.attempt_id
                    AND j.state IN ('Running', 'Creating')
        GROUP BY a.instance_name) u ON u.instance_name = i.name
  SET i.used_memory_bytes = u.memory_bytes, i.used_storage_bytes = u.storage_bytes
  WHERE i.state IN ('pending', 'active');
