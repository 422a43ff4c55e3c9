"""The run report's jinja2 environment: its templates (templates/, installed with the package or in a checkout)
and the filters they use: `num` (a table cell's number) and `link` (a link only where it works)."""

from __future__ import annotations

from typing import Any

from markupsafe import Markup, escape

from cascade.artifacts.tracking import ui_of


def template_env():
    """The report's jinja2 templates, from this package's templates/ (installed or in a checkout)."""
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.PackageLoader("cascade.artifacts", "templates"),
        autoescape=jinja2.select_autoescape(["html", "j2"]),
    )
    env.filters["num"] = _num
    env.filters["link"] = _link
    return env


def _link(url: str, serve: str | None = None) -> Any:
    """A link cell that works: an http(s) URL as a link; a page of a local MLflow store as `serve`, the command
    that serves it, then the page; anything else (a `javascript:` URL included) as plain text, never a link."""
    scheme = url.split(":", 1)[0].lower()
    if scheme == "sqlite":  # a record written before it named the page and its command: the store, then the page
        store, _, page = url.partition("#")
        base, serve = ui_of(store)
        url = f"{base}#{page}"
    if serve:
        return Markup(f"<code>{escape(serve)}</code>, then open <code>{escape(url)}</code>")
    if scheme in ("http", "https"):
        return Markup(f'<a href="{escape(url)}">{escape(url)}</a>')
    return Markup(f"<code>{escape(url)}</code>")


def _num(value: Any, digits: int = 3) -> str:
    """A table cell: numbers rounded (integers with thousands separators), None as a dash."""
    import jinja2

    if value is None or isinstance(value, jinja2.Undefined) or (isinstance(value, float) and value != value):
        return "—"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, int) or (float(value).is_integer() and abs(value) >= 1):
        return f"{int(value):,}"
    return f"{value:.{digits}f}"
