-- A job's scratch storage is reserved, and a job that can never fit is
-- refused (issue 11), as cores and memory already are. Reserved and
-- checked, not enforced: no disk quota holds a job to its reservation.
--
-- instance_collections.worker_storage_bytes: the scratch storage of a
--   pool's machine (NULL: not known, storage is not checked). It is the
--   most a job of the pool may ask for, and its storage per core is what a
--   job asking for none reserves. The local pools' machines have 16 GiB.
-- instances.storage_bytes: the machine's scratch storage, the pool's when
--   the autoscaler records it, what its worker reports when it activates
--   (0: not known, storage is not checked there).
-- jobs.storage_bytes: the job's reservation (the frontend stores what it
--   asked for, else its pool's share). The scheduler's planner places a job
--   only where the storage of the instance less that of its open attempts'
--   jobs leaves room for it.
ALTER TABLE instance_collections ADD COLUMN worker_storage_bytes BIGINT NULL;
ALTER TABLE instances ADD COLUMN storage_bytes BIGINT NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN storage_bytes BIGINT NOT NULL DEFAULT 0;
UPDATE instance_collections SET worker_storage_bytes = 17179869184 WHERE is_pool AND provider = 'local';
