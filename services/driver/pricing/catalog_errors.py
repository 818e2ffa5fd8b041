"""The one error the price catalogues raise: no prices from this catalogue now."""

from __future__ import annotations


class CatalogUnavailable(Exception):
    """A catalogue gave no usable answer (unreachable, too slow, an HTTP error, a malformed or oversized
    body, too many pages). The caller keeps the prices it has. The message is one line naming the
    catalogue and the reason, and never carries a credential."""
