"""HTML pages from templates: the report of `stormlake report` and the artifact page of present.

Jinja2 with autoescape on, so a value from a landing file or an error message is always text on
the page, never markup. Pictures go inline as PNG ``data:`` URIs: a page needs nothing at view time.
"""

from __future__ import annotations

import base64

import jinja2


def png_data_uri(png: bytes) -> str:
    """A PNG as a ``data:`` URI for an ``<img src>``."""
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def page_environment(package: str) -> jinja2.Environment:
    """A Jinja2 environment over ``<package>/templates``: autoescaped, strict about unknown names,
    with the ``png`` filter."""
    env = jinja2.Environment(
        loader=jinja2.PackageLoader(package, "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
    )
    env.filters["png"] = png_data_uri
    return env
