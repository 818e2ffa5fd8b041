-- The W3C trace context (JSON of its headers) of the call that created an
-- update, so the driver can hand it to the worker with each RunJob and a
-- job's run joins the trace of its submission: one trace from the
-- frontend through the driver to the worker. NULL when tracing is off.
ALTER TABLE batch_updates ADD COLUMN trace_context VARCHAR(1024) NULL;
