"""Resource prices: the products an attempt is billed to (products.py), the price file shipped with corral
(price_file.py), the clouds' price catalogues (catalog_gcp.py, catalog_azure.py) and the loop that keeps the
database's rates current (refresh.py)."""
