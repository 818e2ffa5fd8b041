-- Quotas and fair-share weights (issue 41, item 3), per billing project and
-- per user, set by administrators (SetQuota: set_quota). A cap NULL is none;
-- a row with no cap and weight 1 is not kept (set_quota deletes it), so the
-- table holds only what an administrator set. The caps on running cores and
-- running jobs count what runs across every pool; the planner enforces them
-- (QUOTA_REACHED). The cap on ready jobs counts open (unfinished) jobs, as
-- max_open_jobs_per_user does, and job_limits_check enforces it at
-- submission. The weight is the fair share's (services.policy.fair_share).
CREATE TABLE quotas (
  kind ENUM('project', 'user') NOT NULL,
  name VARCHAR(100) NOT NULL,
  max_running_cores_mcpu BIGINT NULL,
  max_running_jobs INT NULL,
  max_ready_jobs BIGINT NULL,
  weight INT NOT NULL DEFAULT 1,
  set_by VARCHAR(100) NOT NULL,
  time_set_ms BIGINT NOT NULL,
  PRIMARY KEY (kind, name)
) ENGINE=InnoDB;
