"""The one error a price catalogue raises."""


class CatalogUnavailable(Exception):
    """The catalogue cannot give prices now (unreachable, refused, timed out, or an answer that makes no
    sense); the prices in force stay. Its message says which catalogue and why, without credentials."""
