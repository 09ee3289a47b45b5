"""HTML pages from templates: the report of `stormlake report` and the artifact page of present.

Jinja2 with autoescape on, so a value from a landing file or an error message is always text on
the page, never markup. Pictures go inline (``stormlake report``'s as PNG ``data:`` URIs, the
present phase's as ``<svg>`` elements): a page needs nothing at view time.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Callable
from typing import Any

import jinja2
import markupsafe


def png_data_uri(png: bytes) -> str:
    """A PNG as a ``data:`` URI for an ``<img src>``."""
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def html_escaped(value: Any) -> Any:
    """``value`` as page text escaped by :func:`html.escape`: quotes become ``&quot;`` and ``&#x27;``
    (markupsafe's autoescape writes ``&#34;`` and ``&#39;``). Markup passes through unchanged."""
    if hasattr(value, "__html__"):
        return value
    return markupsafe.Markup(html.escape(str(value), quote=True))


def page_environment(package: str, *, finalize: Callable[[Any], Any] | None = None) -> jinja2.Environment:
    """A Jinja2 environment over ``<package>/templates``: autoescaped, strict about unknown names,
    with the ``png`` filter.

    ``finalize`` sees every printed value before the autoescape does; :func:`html_escaped` there
    spells the page's entities the way :func:`html.escape` does.
    """
    env = jinja2.Environment(
        loader=jinja2.PackageLoader(package, "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        finalize=finalize,
    )
    env.filters["png"] = png_data_uri
    return env
