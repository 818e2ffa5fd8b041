"""A paged list call as an async iterator of its items.

Every list call of the API takes a `page_token` and answers a page of items
and a `next_page_token` (empty after the last page). `Pages` hides the
tokens: iterating it yields the items, and the next page is asked for only
when iteration reaches it. Its `pages` is the same list a page at a time,
which is how the blocking client reads it: one hop between its thread and
the event loop's per page, not per item.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class Pages(Generic[T]):
    """The items of a list call, `field` of each response to `call(request)`, fetched page by page."""

    def __init__(self, call: Callable[[Any], Awaitable[Any]], request: Any, field: str):
        self.pages: AsyncGenerator[Sequence[T], None] = self._read(call, request, field)
        """The items a page at a time (each page a sequence)."""
        self._items = self._flatten()

    @staticmethod
    async def _read(call: Callable[[Any], Awaitable[Any]], request: Any, field: str
                    ) -> AsyncGenerator[Sequence[T], None]:
        while True:
            page = await call(request)
            yield getattr(page, field)
            if not page.next_page_token:
                return
            request.page_token = page.next_page_token

    async def _flatten(self) -> AsyncGenerator[T, None]:
        async for page in self.pages:
            for item in page:
                yield item

    def __aiter__(self) -> Pages[T]:
        return self

    def __anext__(self) -> Awaitable[T]:
        return self._items.__anext__()

    async def aclose(self) -> None:
        """Stop early (what `contextlib.aclosing` calls): no further page is asked for."""
        await self._items.aclose()
        await self.pages.aclose()
