"""What every drawing shares: escaping, numbers, the `<svg>` element, and nice axis ticks.

The pages are served under a Content-Security-Policy without inline styles, so nothing here writes a
`style` attribute: presentation attributes for geometry, CSS classes (services/web/static/drawing.css)
for colour. Every string that reaches the markup goes through `text` or `attr`, whoever wrote it, and
numbers through `num`, so the same input gives the same bytes.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Iterable

# XML 1.0 allows tab, newline, carriage return and everything from U+0020 but the surrogates and
# U+FFFE/U+FFFF; anything else would make the document ill-formed, so it becomes U+FFFD.
_NOT_XML = re.compile("[^\t\n\r\u0020-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def text(value: object) -> str:
    """`value` as XML character data, escaped."""
    cleaned = _NOT_XML.sub("\ufffd", str(value))
    # A parser reads a raw carriage return as a newline; the reference keeps it.
    return cleaned.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("\r", "&#13;")


def attr(value: object) -> str:
    """`value` as the inside of a double-quoted XML attribute, escaped."""
    return text(value).replace('"', "&quot;").replace("'", "&#39;").replace("\n", "&#10;").replace("\t", "&#9;")


def num(value: float) -> str:
    """A coordinate with at most two decimals and no trailing zeros ('12', '3.5', '-0.25')."""
    rounded = round(value, 2)
    if rounded == 0:
        return "0"
    return f"{rounded:.2f}".rstrip("0").rstrip(".")


def count(n: int) -> str:
    """A count for people: 10,000."""
    return f"{n:,}"


def plural(n: int, one: str, many: str | None = None) -> str:
    """'1 job', '10,000 jobs'."""
    return f"{count(n)} {one if n == 1 else (many or one + 's')}"


def shorten(value: str, limit: int) -> str:
    """`value` cut to `limit` characters, an ellipsis marking the cut."""
    return value if len(value) <= limit else value[: max(limit - 1, 0)] + "…"


def document(*, kind: str, width: float, height: float, title: str, desc: str, body: Iterable[str]) -> str:
    """The `<svg>` element around `body`: labelled by its <title> and described by its <desc>, a viewBox so
    that it scales; role="img", or role="group" when it holds links (an image holds nothing a keyboard can
    reach: its links would be hidden from assistive technology, which axe-core reports as nested-interactive). Its ids come from a digest of the content, so they are the same for the
    same drawing and differ between drawings on one page."""
    inner = "".join(body)
    digest = hashlib.sha256(f"{kind}\0{title}\0{desc}\0{inner}".encode()).hexdigest()[:12]
    ident = f"{kind}-{digest}"
    role = "group" if "<a " in inner else "img"
    return (f'<svg xmlns="http://www.w3.org/2000/svg" class="drawing {attr(kind)}" role="{role}" '
            f'viewBox="0 0 {num(width)} {num(height)}" width="{num(width)}" height="{num(height)}" '
            f'aria-labelledby="{ident}-title" aria-describedby="{ident}-desc">'
            f'<title id="{ident}-title">{text(title)}</title><desc id="{ident}-desc">{text(desc)}</desc>'
            f"{inner}</svg>")


def standalone(svg: str, stylesheet_href: str) -> str:
    """A drawing as a document of its own (served as image/svg+xml, opened by a link): an XML declaration
    and a processing instruction that links the stylesheet, which an inline drawing gets from its page.
    Without it, a browser fills every shape black."""
    return (f'<?xml version="1.0" encoding="UTF-8"?>\n'
            f'<?xml-stylesheet type="text/css" href="{attr(stylesheet_href)}"?>\n{svg}')


def nice_step(span: float, most: int) -> float:
    """The smallest step of 1, 2 or 5 times a power of ten that cuts `span` into at most `most` parts."""
    if span <= 0 or not math.isfinite(span):
        return 1.0
    raw = span / max(most, 1)
    power = 10.0 ** math.floor(math.log10(raw))
    for factor in (1.0, 2.0, 5.0, 10.0):
        if factor * power >= raw:
            return factor * power
    return 10.0 * power


def nice_ticks(low: float, high: float, most: int = 6) -> list[float]:
    """Round values from at or below `low` to at or above `high`, at most `most`+1 steps apart
    (0, 20, 40, 60 for 3 to 57). A range too narrow to cut (a constant series) is widened upwards."""
    if high < low:
        low, high = high, low
    scale = max(1.0, abs(low), abs(high))
    if high - low < scale * 1e-9:
        high = low + scale
    step = nice_step(high - low, most)
    decimals = max(0, 1 - math.floor(math.log10(step)))  # keeps 0.1 * 3 from printing as 0.30000000000000004
    first = math.floor(low / step)
    last = math.ceil(high / step)
    return [round(i * step, decimals) + 0.0 for i in range(first, last + 1)]
