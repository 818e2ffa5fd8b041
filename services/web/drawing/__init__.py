"""Drawings for the web UI, rendered on the server as SVG markup: a batch's DAG (`dag`), its attempts by
worker over time (`timeline`) and small line and bar charts (`charts`).

Pure: nothing but the standard library and Graphviz's `dot` program (run by `layout`), nothing of the
rest of services/web. No `style` attribute anywhere (the pages' Content-Security-Policy forbids inline
styles): colours are CSS classes, defined in services/web/static/drawing.css. Every string is escaped,
and the same input gives the same bytes.
"""
