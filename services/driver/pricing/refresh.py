"""Keeping the database's prices current (design §5, "price refresh").

- `sync_price_file`, when a driver starts: the price file's prices of the deployment's machines, and which
  products are the deployment's (active; the reservation estimate reads those). A product with no price
  gets the file's; a file price the file now states differently is corrected; a catalogue's price is
  never replaced by the file's (set_product_rates.sql).
- `PriceRefresh`, a leader loop: every `refresh_s` it reads the cloud's price catalogue for the
  deployment's machines, and a price that changed becomes a new resource version, which attempts that
  start from then on are billed at; attempts already started keep theirs. A catalogue that cannot be
  reached (an offline deployment, an outage) is logged and tried again after `retry_s`; the prices in
  force stay.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Collection, Mapping
from typing import Protocol

from services.driver.loop import Loop
from services.driver.metrics import PRICE_CHANGES, PRICE_REFRESH_FAILURES
from services.driver.pricing.catalog_errors import CatalogUnavailable
from services.driver.pricing.price_file import PriceFile
from services.driver.pricing.products import Machine, MachinePrice, ProductRate
from services.driver.store import DriverStore

log = logging.getLogger(__name__)

MAX_RATES_PER_CALL = 1000
"""set_product_rates takes at most this many."""


class Catalog(Protocol):
    """A cloud's price catalogue."""

    source: str
    """What the database records as the prices' source: gcp-catalog, azure-catalog."""

    async def prices(self, machines: Collection[Machine]) -> Mapping[Machine, MachinePrice]:
        """The current prices of those of `machines` it lists; CatalogUnavailable if it cannot say now."""


@dataclasses.dataclass(frozen=True)
class RefreshSettings:
    refresh_s: float = 6 * 3600.0
    """Between two reads of the catalogue (its prices change daily at most; Spot prices up to monthly)."""
    retry_s: float = 900.0
    """After a read that failed."""


def rates_of(prices: Mapping[Machine, MachinePrice]) -> list[ProductRate]:
    return [rate for machine, price in sorted(prices.items(), key=lambda mp: mp[0].cpu_product)
            for rate in price.rates(machine)]


def products_of(machines: Collection[Machine]) -> list[str]:
    return sorted({p for m in machines for p in (m.cpu_product, m.memory_product)})


async def set_rates(store: DriverStore, rates: list[ProductRate], source: str,
                    active_products: list[str] | None = None) -> list[dict[str, object]]:
    """set_product_rates in calls of at most MAX_RATES_PER_CALL (the active products with the first);
    every change made, logged and counted."""
    changed: list[dict[str, object]] = []
    for start in range(0, max(1, len(rates)), MAX_RATES_PER_CALL):
        changed += await store.set_product_rates([dataclasses.asdict(r) for r in
                                                  rates[start:start + MAX_RATES_PER_CALL]], source,
                                                 active_products if start == 0 else None)
    for row in changed:
        PRICE_CHANGES.labels(source).inc()
        log.info("price of %s: %s USD per unit (was %s), from %s", row["resource_name"], row["rate_usd"],
                 row["previous_rate_usd"], source)
    return changed


async def sync_price_file(store: DriverStore, prices: PriceFile, machines: Collection[Machine]) -> list[Machine]:
    """Give the deployment's machines the file's prices where no catalogue has, and make their products
    the active ones; the machines the file does not price (logged: the catalogue may)."""
    priced = {m: p for m in machines if (p := prices.price(m)) is not None}
    unpriced = sorted((m for m in machines if m not in priced), key=lambda m: m.cpu_product)
    await set_rates(store, rates_of(priced), "file", products_of(machines))
    if unpriced:
        log.warning("the price file (as of %s) has no price for %d of the deployment's machines, e.g. %s; "
                    "they get one when the price refresh reads it from the cloud's catalogue, and the autoscaler "
                    "creates none of them until then", prices.as_of or "?", len(unpriced), unpriced[0].cpu_product)
    return unpriced


class PriceRefresh(Loop):
    """While this driver leads: the price file's prices once (again after each election, in case the
    previous leader ran another file), then the cloud's catalogue every `settings.refresh_s`."""

    name = "price-refresh"

    def __init__(self, store: DriverStore, prices: PriceFile, catalog: Catalog | None, machines: Collection[Machine],
                 epoch: Callable[[], int | None], settings: RefreshSettings = RefreshSettings(),
                 clock_s: Callable[[], float] = time.monotonic):
        super().__init__(period_s=min(settings.refresh_s, settings.retry_s))
        self._store = store
        self._prices = prices
        self._catalog = catalog
        self._machines = frozenset(machines)
        self._epoch = epoch
        self._settings = settings
        self._clock_s = clock_s
        self._synced_epoch: int | None = None
        self._due_s = 0.0
        self.refreshed = 0
        """Catalogue reads that succeeded."""

    async def sync_file(self) -> None:
        """The price file's prices (sync_price_file): at start, by every driver, and by the loop."""
        await sync_price_file(self._store, self._prices, self._machines)

    async def cycle(self) -> None:
        epoch = self._epoch()
        if epoch is None:
            return
        if self._synced_epoch != epoch:
            await self.sync_file()
            self._synced_epoch = epoch
        now = self._clock_s()
        if self._catalog is None or now < self._due_s:
            return
        try:
            prices = await self._catalog.prices(self._machines)
        except CatalogUnavailable as e:
            PRICE_REFRESH_FAILURES.labels(self._catalog.source).inc()
            self._due_s = now + self._settings.retry_s
            log.warning("price refresh: %s; the prices in force stay, next try in %.0f s", e, self._settings.retry_s)
            return
        found = {m: p for m, p in prices.items() if m in self._machines}
        changed = await set_rates(self._store, rates_of(found), self._catalog.source)
        self._due_s = now + self._settings.refresh_s
        self.refreshed += 1
        log.info("price refresh: %s listed %d of %d machines; %d prices changed", self._catalog.source, len(found),
                 len(self._machines), len(changed))
