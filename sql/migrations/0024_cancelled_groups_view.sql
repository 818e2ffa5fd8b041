-- Every job group that is cancelled, itself or through an ancestor (a
-- cancelled batch is its group 0, the ancestor of all), with the group whose
-- cancellation reaches it: one row per (group, cancelled self or ancestor).
-- The one statement of "this group is cancelled", which a job of it may run
-- only if it always runs: the procedures ask it as
--   EXISTS (SELECT 1 FROM job_groups_cancelled_self_or_ancestor x
--           WHERE x.batch_id = ... AND x.job_group_id = ...)
-- or, for a batch's groups, job_group_id IN (SELECT x.job_group_id ...).
-- A plain join, so MariaDB merges it into each statement: the plans are the
-- ones the join written out gave (tests/unit/test_runnable_rule.py says how
-- that was measured, and why this is a view rather than a stored function).
CREATE ALGORITHM=MERGE VIEW job_groups_cancelled_self_or_ancestor AS
  SELECT a.batch_id, a.job_group_id, c.job_group_id AS cancelled_group_id
  FROM job_groups_cancelled c
  JOIN job_group_self_and_ancestors a ON a.batch_id = c.batch_id AND a.ancestor_id = c.job_group_id;
