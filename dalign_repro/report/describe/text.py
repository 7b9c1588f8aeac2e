"""How a page writes a number, a missing value and a table, and which rows a sentence reads (trained runs).
"""

from __future__ import annotations

import math

import pandas as pd

__all__ = ["DASH", "D_ALIGN_HTML", "number", "styled", "trained_rows"]


DASH = "—"
"""What a table shows where there is no value (never ``NaN``)."""
D_ALIGN_HTML = "d<sub>align</sub>"
"""d_align in a table header or cell (HTML; tables are not typeset as math)."""


def number(value: float, html: bool = False) -> str:
    """A number for a sentence: 3 significant digits, written as a power of ten outside 0.001 to 10,000.

    The power of ten is math (``$1.2 \\times 10^{-5}$``) for Markdown, or with ``html=True``
    HTML (``1.2×10<sup>−5</sup>``) for a table cell, which is not typeset.
    """
    value = float(value)
    if value == 0 or not math.isfinite(value):
        return "0" if value == 0 else str(value)
    size = abs(value)
    if 1e-3 <= size < 1e3:
        return f"{value:.3g}"
    if 1e3 <= size < 1e4:
        return f"{value:,.0f}"
    exponent = math.floor(math.log10(size))
    mantissa = value / 10**exponent
    if round(mantissa, 2) in (10.0, -10.0):
        mantissa, exponent = mantissa / 10, exponent + 1
    if html:
        return f"{mantissa:.3g}×10<sup>{str(exponent).replace('-', '−')}</sup>"
    return f"${mantissa:.3g} \\times 10^{{{exponent}}}$"


def styled(frame: pd.DataFrame, formats: dict | None = None, precision: int = 3):
    """``frame`` as a book table: no index, ``precision`` decimals, thousands separators, a dash for a missing value.

    ``formats`` maps a column to a format string or function (``{"lr": "{:g}"}``).
    """
    style = frame.style.hide(axis="index").format(precision=precision, thousands=",", na_rep=DASH)
    style = style.set_table_styles([{"selector": "th, td", "props": [("padding", "0.3em 0.75em")]}])
    for column, spec in (formats or {}).items():
        if column in frame:
            style = style.format(spec, subset=[column], na_rep=DASH)
    return style


def trained_rows(table: pd.DataFrame) -> pd.DataFrame:
    return table[table.trained_ok.astype(bool)] if "trained_ok" in table and len(table) else table
