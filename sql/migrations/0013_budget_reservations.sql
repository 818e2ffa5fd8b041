-- Spending limits that are never overshot (issue 11, design §9). Before an
-- attempt of a project with a limit starts, schedule_jobs reserves its
-- worst-case cost: its cores and memory at the resources' rates for its
-- timeout, or for the project's longest job when it has none, plus the
-- time a worker may take to kill it (KILL_ALLOWANCE_MS in schedule_jobs).
-- It starts only if spend + reservations + its own stay within the limit.
-- The reservation is released when the attempt ends (the attempts update
-- trigger), and billing never counts more of an attempt than it reserved.
--
-- attempts.reserved_micro_usd / reserved_ms: an open attempt's reservation
-- (0 / NULL for projects without a limit, and once the attempt ended).
-- aggregated_billing_project_reservations: their sum per project, spread
-- over tokens like the other counters; the invariant checker recomputes it
-- from the open attempts.
ALTER TABLE billing_projects ADD COLUMN max_job_duration_ms BIGINT NOT NULL DEFAULT 3600000;
ALTER TABLE jobs ADD COLUMN timeout_ms BIGINT NULL;
ALTER TABLE attempts
  ADD COLUMN reserved_micro_usd BIGINT NOT NULL DEFAULT 0,
  ADD COLUMN reserved_ms BIGINT NULL;
CREATE TABLE aggregated_billing_project_reservations (
  billing_project VARCHAR(100) NOT NULL,
  token TINYINT NOT NULL,
  reserved_micro_usd BIGINT NOT NULL DEFAULT 0,
  PRIMARY KEY (billing_project, token)
) ENGINE=InnoDB;
