-- A paused pool (issue 41, pause a pool): nothing new starts there and the
-- autoscaler makes no machine for it; its running jobs finish, and its idle
-- machines leave as usual. Who paused it and when, for ExplainJob and
-- ListPools. set_pool_paused writes it (PausePool, ResumePool).
ALTER TABLE instance_collections
  ADD COLUMN paused BOOLEAN NOT NULL DEFAULT FALSE,
  ADD COLUMN paused_by VARCHAR(100) NULL,
  ADD COLUMN time_paused_ms BIGINT NULL;
