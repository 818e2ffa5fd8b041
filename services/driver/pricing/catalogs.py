"""The clouds' price catalogues as the price loop reads them (refresh.Catalog): each reader's prices of the
deployment's machines, in the shape every product is priced in (a core-hour and a GiB-hour price)."""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping

from services.driver.pricing.catalog_azure import AzureRetailSettings, azure_prices
from services.driver.pricing.catalog_gcp import GcpCatalogSettings, gcp_prices
from services.driver.pricing.price_file import AzureSize
from services.driver.pricing.products import Machine, MachinePrice, split_vm_price

log = logging.getLogger(__name__)


class GcpCatalog:
    """The Cloud Billing Catalog: a series' core-hour and GiB-hour prices, as they are."""

    source = "gcp-catalog"

    def __init__(self, settings: GcpCatalogSettings):
        self._settings = settings

    async def prices(self, machines: Collection[Machine]) -> Mapping[Machine, MachinePrice]:
        return await gcp_prices(self._settings, machines)


class AzureCatalog:
    """The Retail Prices API: a size's VM-hour price, split over its vCPUs and memory (`sizes`, from the price
    file: the API does not say them). A size the file does not list gets no price from here."""

    source = "azure-catalog"

    def __init__(self, settings: AzureRetailSettings, sizes: Mapping[str, AzureSize]):
        self._settings = settings
        self._sizes = sizes

    async def prices(self, machines: Collection[Machine]) -> Mapping[Machine, MachinePrice]:
        sized = [m for m in machines if m.name in self._sizes]
        if unsized := {m.name for m in machines} - set(self._sizes):
            log.warning("azure prices: %d VM sizes (e.g. %s) have no vCPUs and memory in the price file, so no "
                        "price from the catalogue", len(unsized), min(unsized))
        return {m: split_vm_price(hour_usd, self._sizes[m.name].vcpus, self._sizes[m.name].memory_gib)
                for m, hour_usd in (await azure_prices(self._settings, sized)).items()}
