"""Page tokens of the frontend's listing calls: the key of the last item of a page, opaque to callers
(URL-safe base64, so a token goes into a REST query string as it is)."""

from __future__ import annotations

import base64


def encode(key: str) -> str:
    """The token of a page that ended at `key`."""
    return base64.urlsafe_b64encode(key.encode()).decode()


def decode(token: str) -> str | None:
    """The key `encode` made `token` of; None for anything `encode` does not make."""
    try:
        return base64.b64decode(token.encode(), altchars=b"-_", validate=True).decode()
    except (ValueError, UnicodeDecodeError):
        return None
