"""The OCI registry `corral up` runs on loopback (Debian's docker-registry, the CNCF distribution
registry), and the images corral seeds it with, built from Debian packages."""
