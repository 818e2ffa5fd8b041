"""The worker's Prometheus metrics (services.common.metrics serves them)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

RUNNING_ATTEMPTS = Gauge("corral_worker_running_attempts", "Attempts this worker holds that have not ended "
                         "(starting, running, or uploading their outputs and log).")
IMAGE_PULLS = Counter("corral_worker_image_pulls", "Images this worker fetched from a registry and unpacked, by "
                      "outcome (pulled, failed); an image already in the cache is not pulled again.", ["outcome"])
for _outcome in ("pulled", "failed"):
    IMAGE_PULLS.labels(_outcome)  # both series exist from the start, at 0
IMAGE_CACHE_BYTES = Gauge("corral_worker_image_cache_bytes", "Bytes of unpacked images in this worker's cache.")
LOG_UPLOAD_BYTES = Counter("corral_worker_log_upload_bytes", "Bytes of job logs this worker uploaded to storage.")
