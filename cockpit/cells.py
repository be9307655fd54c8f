"""Text in terminal cells (wide characters count two): cut with an ellipsis, padded to a width.
Pure; shared by the CLI's tables (``cockpit compare``) and the cockpit's (``cockpit.ui.widgets``),
so neither cuts a cell silently. Uses ``rich.cells`` (installed with textual), never textual."""

from __future__ import annotations


def value_text(value: object) -> str:
    """A swept value or an objective as every listing prints it (the sweep's driver log, ``cockpit
    sweep status``, the Sweep screen): a float to 4 significant digits (9.732e-05), None as "-"."""
    if value is None:
        return "-"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def clip(text: str, width: int) -> str:
    """``text`` in at most ``width`` cells, an ellipsis where it was cut."""
    from rich.cells import cell_len, set_cell_size

    if cell_len(text) <= width:
        return text
    return set_cell_size(text, max(0, width - 1)) + "…" if width > 0 else ""


def fit(text: str, width: int) -> str:
    """``text`` in exactly ``width`` cells: clipped with an ellipsis, or padded with spaces."""
    from rich.cells import cell_len

    cut = clip(text, width)
    return cut + " " * max(0, width - cell_len(cut))
