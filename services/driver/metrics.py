"""The driver's Prometheus metrics (services.common.metrics serves them).

Counters and histograms are updated where the work happens (the loops, the
scheduler, the planner's call, the cancellers). The gauges of the queue
and the fleet (ready and running jobs by pool and user, workers by state)
are read from the database by `FleetGauges`, a loop of the leader's, every
few seconds (services/driver/fleet_gauges.py): a scrape never queries the
database.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

LOOP_SECONDS = Histogram("corral_driver_loop_cycle_seconds", "How long each cycle of each driver loop took (a "
                         "standby's cycles do nothing and are quick).", ["loop"],
                         buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))
LOOP_FAILURES = Counter("corral_driver_loop_failures", "Cycles of each driver loop that failed (logged, retried "
                        "after a back-off).", ["loop"])
JOBS_SCHEDULED = Counter("corral_driver_jobs_scheduled", "Attempts the scheduler started (each scheduled on a "
                         "worker and sent to it), by pool.", ["pool"])
JOBS_CANCELLED = Counter("corral_driver_jobs_cancelled", "Jobs the cancellers drained, by loop: cancel-ready "
                         "(Ready and Pending jobs of cancelled batches and groups, ended in the database), "
                         "cancel-running (Creating attempts closed and Running ones told to stop).", ["loop"])
FAIR_SHARE_SECONDS = Histogram("corral_driver_fair_share_seconds", "How long the planner took to share one pool "
                               "out (fair share, locks, budgets, placements) in one scheduler cycle.", ["pool"],
                               buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1))
READY_JOBS = Gauge("corral_driver_ready_jobs", "Jobs Ready to run (cancelled groups' included until the "
                   "canceller ends them), by pool and user.", ["pool", "user"])
READY_CORES = Gauge("corral_driver_ready_cores", "Cores the Ready jobs ask for, by pool and user.", ["pool", "user"])
RUNNING_JOBS = Gauge("corral_driver_running_jobs", "Jobs being started or running, by pool and user.",
                     ["pool", "user"])
RUNNING_CORES = Gauge("corral_driver_running_cores", "Cores the running jobs reserve, by pool and user.",
                      ["pool", "user"])
WORKERS = Gauge("corral_driver_workers", "Worker machines by pool and state (pending, active, inactive).",
                ["pool", "state"])
PRICE_CHANGES = Counter("corral_driver_price_changes", "Product prices that changed (each a new resource version), "
                        "by source: file (the price file, at start) or the cloud's catalogue.", ["source"])
PRICE_REFRESH_FAILURES = Counter("corral_driver_price_refresh_failures", "Reads of the cloud's price catalogue "
                                 "that failed; the prices in force stay.", ["source"])
PROVIDER_REFUSALS = Counter("corral_driver_provider_refusals", "Machines a cloud refused to create, by pool, region "
                            "and kind (quota_exceeded, capacity_exhausted, permission_denied, invalid_request, "
                            "transient_error, provider_error: an unclassified refusal). The autoscaler ends the "
                            "refused machine's instance at once and backs off (docs/operations.md).",
                            ["pool", "region", "kind"])
INSTANCES_RECONCILED = Counter("corral_driver_instances_reconciled", "What the reconciler did: "
                               "vanished_deactivated (an instance the database had as live that the cloud no "
                               "longer runs), orphan_deleted (a machine the cloud runs that the database does "
                               "not know or knows as ended).", ["action"])
