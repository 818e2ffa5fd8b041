-- A job that can never run under its billing project's limit is cancelled,
-- saying why (issue 11, design §9): its worst-case cost (what schedule_jobs
-- would reserve) is more than the limit leaves after the project's spend
-- alone. The scheduler's planner finds such jobs (Plan.never_fit) and
-- cancel_unaffordable_jobs checks each again under the project's lock.
-- jobs.end_reason: why the control plane ended a job that no attempt
-- explains (NULL otherwise); ExplainJob and GetJob show it.
ALTER TABLE jobs ADD COLUMN end_reason VARCHAR(512) NULL;
