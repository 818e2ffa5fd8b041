-- What each attempt's worker reported about it, so a job's page can say
-- how every attempt ended, not only the last one (jobs.exit_code):
--   exit_code          the command's exit code (128 + signal when a signal
--                      killed it); NULL if it never ran to an exit
--   error_message      what went wrong, in words; NULL if nothing did
--   isolation          the runtime's words on how the job was isolated, set
--                      when it started (the process runtime says plainly that
--                      no container isolated it)
--   cpu_time_ms        CPU time of the command and its children, where known
--   peak_memory_bytes  peak resident memory of its largest process, where known
-- mark_jobs_started sets isolation; mark_jobs_complete (complete_jobs_core)
-- sets the rest, once: a closed attempt keeps what it has.
ALTER TABLE attempts
  ADD COLUMN exit_code INT NULL,
  ADD COLUMN error_message TEXT NULL,
  ADD COLUMN isolation VARCHAR(512) NULL,
  ADD COLUMN cpu_time_ms BIGINT NULL,
  ADD COLUMN peak_memory_bytes BIGINT NULL;

-- Since workers serve WorkerService, the column holds its host:port (what the
-- frontend dials, with mutual TLS, to read the log of a running attempt).
ALTER TABLE instances
  MODIFY ip_address VARCHAR(64) NULL COMMENT 'host:port of the worker''s WorkerService (mutual TLS)';
