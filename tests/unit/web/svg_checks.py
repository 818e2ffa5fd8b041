"""What every drawing must be, checked on its markup: well-formed XML, an accessible <svg> (role="img", or
"group" when it holds links, labelled by its own <title>, described by its own <desc>, a viewBox), no
`style` attribute or element and no script anywhere (the pages' Content-Security-Policy), links only where
the drawing was told."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

SVG = "{http://www.w3.org/2000/svg}"
_NOT_XML = re.compile("[^\t\n\r\u0020-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def parsed(svg: str) -> ET.Element:
    """The drawing's root, after checking what every drawing must be."""
    root = ET.fromstring(svg)
    assert root.tag == f"{SVG}svg"
    links = root.find(".//{http://www.w3.org/2000/svg}a") is not None
    assert root.get("role") == ("group" if links else "img")
    assert re.fullmatch(r"0 0 [0-9.]+ [0-9.]+", root.get("viewBox", ""))
    title, desc = root[0], root[1]
    assert title.tag == f"{SVG}title" and title.get("id") == root.get("aria-labelledby") and title.text
    assert desc.tag == f"{SVG}desc" and desc.get("id") == root.get("aria-describedby") and desc.text
    for element in root.iter():
        assert "style" not in element.attrib, element.tag
        assert element.tag not in (f"{SVG}style", f"{SVG}script", f"{SVG}foreignObject"), element.tag
        assert not any(name.startswith("on") for name in element.attrib), element.attrib
    return root


def hrefs(root: ET.Element) -> list[str]:
    return [a.get("href", "") for a in root.iter(f"{SVG}a")]


def texts(root: ET.Element) -> list[str]:
    """Every piece of text in the drawing, tooltips included."""
    return ["".join(element.itertext()) for element in root.iter() if element.tag in (f"{SVG}text", f"{SVG}title")]


def as_shown(value: str) -> str:
    """`value` as a drawing shows it: characters XML cannot hold replaced."""
    return _NOT_XML.sub("\ufffd", value)
