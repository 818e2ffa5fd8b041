-- Internal (complete_jobs_core): which attempt ends make a new attempt
-- instead of a final state (design §9, RetryPolicy in the protos). Looks at
-- the rows of tmp_job_completions that may retry (may_retry: set by
-- mark_jobs_complete and deactivate_instance) and would end the job now
-- (outcome 'completed', Failed or Error, the job's current attempt). While
-- the job has attempts left (n_attempts < max_attempts):
--   preempted            retried, not a failure; after the policy's
--                        max_preemptions_before_on_demand preemptions the job
--                        runs only on on-demand machines from then on;
--   worker_lost          retried, not a failure;
--   system_error         retried, not a failure, away from that worker;
--   out_of_memory        retried with its memory times the policy's
--                        oom_memory_factor, up to its max_memory_bytes or the
--                        pool's machine, if that is more than it had;
--   exited (Failed)      retried while n_failed_retries < max_failed_retries
--                        and the exit code is one the policy lists (none
--                        listed: any), after delay_ms x 2^n_failed_retries
--                        (at most max_delay_ms) less a random part of up to
--                        half of it.
-- Anything else (timed out, cancelled, no policy, no attempts left) ends the
-- job as reported. A retried row gets outcome 'retried', new_state 'Ready',
-- and the job's next size and wait in its columns. The policy is the job's
-- own, else that of its nearest job group that sets one.
DROP PROCEDURE IF EXISTS decide_retries;
DELIMITER $$
CREATE PROCEDURE decide_retries(IN in_now_ms BIGINT)
BEGIN
  UPDATE tmp_job_completions t
    JOIN jobs j ON j.batch_id = t.batch_id AND j.job_id = t.job_id
    SET t.n_attempts = j.n_attempts, t.max_attempts = j.max_attempts,
        t.n_preemptions = j.n_preemptions, t.n_failed_retries = j.n_failed_retries,
        t.pool_memory_bytes = (SELECT c.worker_memory_bytes FROM instance_collections c WHERE c.name = j.inst_coll),
        t.retry_policy = COALESCE(j.retry_policy, (
          SELECT g.retry_policy FROM job_group_self_and_ancestors a
          JOIN job_groups g ON g.batch_id = a.batch_id AND g.job_group_id = a.ancestor_id
          WHERE a.batch_id = j.batch_id AND a.job_group_id = j.job_group_id AND g.retry_policy IS NOT NULL
          ORDER BY a.level LIMIT 1))
    WHERE t.may_retry AND t.outcome = 'completed' AND t.new_state IN ('Failed', 'Error')
      AND t.old_state IN ('Running', 'Creating') AND t.attempt_id = t.old_attempt_id;

  -- Ended around the command, not by it: not a failure.
  UPDATE tmp_job_completions
    SET outcome = 'retried',
        to_on_demand = reason = 'preempted'
          AND COALESCE(CAST(JSON_VALUE(retry_policy, '$.max_preemptions_before_on_demand') AS SIGNED), 0) > 0
          AND n_preemptions + 1 >= CAST(JSON_VALUE(retry_policy, '$.max_preemptions_before_on_demand') AS SIGNED),
        avoid_instance = IF(reason = 'system_error', instance_name, NULL),
        retry_reason = CASE reason
          WHEN 'preempted' THEN CONCAT('preempted (', n_preemptions + 1, ' so far): not a failure')
          WHEN 'worker_lost' THEN 'its worker was lost: not a failure'
          ELSE CONCAT('system error on ', COALESCE(instance_name, 'its worker'),
                      ': not a failure; the next attempt runs elsewhere') END
    WHERE n_attempts IS NOT NULL AND n_attempts < max_attempts
      AND reason IN ('preempted', 'worker_lost', 'system_error');
  UPDATE tmp_job_completions
    SET retry_reason = CONCAT(retry_reason, '; on-demand machines from now on')
    WHERE outcome = 'retried' AND to_on_demand;

  -- Out of memory, with a policy that grows it.
  UPDATE tmp_job_completions
    SET next_memory_bytes = LEAST(
          CEIL(memory_bytes * (JSON_VALUE(retry_policy, '$.oom_memory_factor') + 0e0)),
          COALESCE(NULLIF(CAST(JSON_VALUE(retry_policy, '$.max_memory_bytes') AS SIGNED), 0),
                   NULLIF(pool_memory_bytes, 0), 9223372036854775807))
    WHERE outcome = 'completed' AND n_attempts IS NOT NULL AND n_attempts < max_attempts
      AND reason = 'out_of_memory' AND memory_bytes > 0
      AND COALESCE(JSON_VALUE(retry_policy, '$.oom_memory_factor') + 0e0, 0) > 1;
  UPDATE tmp_job_completions
    SET outcome = 'retried',
        retry_reason = CONCAT('out of memory at ', CEIL(memory_bytes / 1048576), ' MiB: retried with ',
                              CEIL(next_memory_bytes / 1048576), ' MiB')
    WHERE outcome = 'completed' AND next_memory_bytes > memory_bytes;
  UPDATE tmp_job_completions SET next_memory_bytes = NULL WHERE outcome <> 'retried';

  -- A non-zero exit the policy retries, after a growing, jittered delay.
  UPDATE tmp_job_completions
    SET outcome = 'retried',
        retry_delay_ms = CEIL(LEAST(CAST(JSON_VALUE(retry_policy, '$.delay_ms') AS SIGNED)
                                    * POW(2, n_failed_retries),
                                    CAST(JSON_VALUE(retry_policy, '$.max_delay_ms') AS SIGNED))
                              * (1 - RAND() / 2))
    WHERE outcome = 'completed' AND n_attempts IS NOT NULL AND n_attempts < max_attempts
      AND reason = 'exited' AND new_state = 'Failed' AND exit_code IS NOT NULL AND exit_code <> 0
      AND n_failed_retries < COALESCE(CAST(JSON_VALUE(retry_policy, '$.max_failed_retries') AS SIGNED), 0)
      AND (COALESCE(JSON_LENGTH(retry_policy, '$.exit_codes'), 0) = 0
           OR JSON_CONTAINS(JSON_EXTRACT(retry_policy, '$.exit_codes'), CAST(exit_code AS CHAR)));
  UPDATE tmp_job_completions
    SET not_before_ms = in_now_ms + retry_delay_ms,
        retry_reason = CONCAT('exit code ', exit_code, ': retry ', n_failed_retries + 1, ' of ',
                              JSON_VALUE(retry_policy, '$.max_failed_retries'), ' after ',
                              FORMAT(retry_delay_ms / 1000, 3), ' s')
    WHERE outcome = 'retried' AND retry_delay_ms IS NOT NULL;

  UPDATE tmp_job_completions SET new_state = 'Ready' WHERE outcome = 'retried';
END $$
DELIMITER ;
