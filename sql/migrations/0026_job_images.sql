-- The image a job's spec names, kept beside what scheduling needs: the
-- planner prefers, all else equal, a worker whose image cache holds it
-- (workers report their caches to the driver). NULL: not recorded (a job
-- inserted before this migration, or a reference longer than the column,
-- which is then only in the spec): such a job goes first-fit.
ALTER TABLE jobs ADD COLUMN image VARCHAR(255) NULL;
