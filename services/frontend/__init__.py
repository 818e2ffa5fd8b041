"""The frontend: the public batch, job and billing API (stateless, several replicas)."""
