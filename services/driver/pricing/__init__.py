"""Resource prices: the products an attempt is billed to (products.py), the price file shipped with corral
(price_file.py), the clouds' price catalogues (catalog_gcp.py and catalog_azure.py read them, catalog_rules.py
says which entry prices which machine, catalogs.py is how the price loop reads them) and the loop that keeps
the database's rates current (refresh.py)."""
