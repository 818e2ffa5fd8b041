"""corral's data layer: the pool, procedure calls, migrations and invariants."""
