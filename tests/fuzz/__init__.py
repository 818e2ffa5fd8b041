"""Fuzzing: generated inputs for the query language (`query_inputs`), job
specs and submissions walked from the protobuf descriptors (`job_specs`),
and the checks each input must pass. Used by the tests of every tier and by
`python -m bench fuzz-query` (the long run: docs/security.md, Fuzzing)."""
