"""Theme colours for the Rich renderables the UI builds (``rich.text.Text`` in panes and table cells).

Textual resolves theme variables (``$text-error``, ``$success``, ...) in its own content markup,
``Content`` and TCSS, but not in Rich styles. :func:`themed` gives a Rich style for a Textual style
string such as ``"bold $text-error"``, resolved with the running app's theme (Textual's own style
parser), so Rich text follows the theme (a 16-colour theme gives the terminal's own colours) and no
module names a colour. Outside an app (unit tests, scripts) the default theme's colours are used.

Build Rich text on the UI thread (a thread worker does not see the running app): workers post
their data in a message, the handler renders it.

The roles used: ``$text-error`` failed, ``$text-success`` finished / passed / fits,
``$text-warning`` warnings and alerts, ``$text-primary`` highlights (values, names, info);
``$error`` / ``$warning`` / ``$success`` for blocks (bars, the trained-token background).
Secondary text stays Rich's ``dim`` (an attribute, not a colour: ``$text-muted`` needs a
background to blend with, which a Rich style has not).
"""

from __future__ import annotations

from rich.style import Style as RichStyle
from textual._context import active_app  # the running app, as Textual's Content.from_rich_text reads it
from textual.markup import parse_style
from textual.theme import BUILTIN_THEMES

DEFAULT_THEME = "textual-dark"  # Textual's default; what a style resolves to outside an app

_cache: dict[tuple[str, str], RichStyle] = {}


def _default_variables() -> dict[str, str]:
    theme = BUILTIN_THEMES[DEFAULT_THEME]
    return {**theme.to_color_system().generate(), **theme.variables}


def theme_name() -> str:
    """The theme :func:`themed` resolves in now: the running app's once its CSS is read, else the default."""
    app = active_app.get(None)
    return str(app.theme) if app is not None and getattr(app, "theme_variables", None) else DEFAULT_THEME


def themed(spec: str) -> RichStyle | str:
    """The Rich style for a Textual style string (``"bold $text-error"``) in the current theme; a
    string without a variable (``"bold"``, ``"dim"``, ``""``) is returned as it is."""
    if "$" not in spec:
        return spec
    key = (theme_name(), spec)
    found = _cache.get(key)
    if found is None:
        variables: dict[str, str] | None = getattr(active_app.get(None), "theme_variables", None)
        found = _cache[key] = parse_style(spec, variables or _default_variables()).rich_style
    return found
