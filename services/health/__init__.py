"""`python -m services.health`: ask a corral service's gRPC health over its own TLS, for probes."""
