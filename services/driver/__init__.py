"""The driver: the leader-elected owner of every background loop."""
