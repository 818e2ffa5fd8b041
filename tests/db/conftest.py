"""Procedure-level tests use the `world` and `clock` fixtures of tests/conftest.py
(the helpers behind them are in tests/world.py)."""
