"""What every ``dalign`` subcommand prints alike: numbers in a few digits, plain-text tables, names clipped
to a width, and progress bars with an ETA on stderr."""

from __future__ import annotations

import math

__all__ = ["format_value", "render_table", "clip_left", "with_progress"]


def format_value(x) -> str:
    """``x`` in a few significant digits for a table (``-`` for None, ``nan`` and ``inf`` as such)."""
    if x is None:
        return "-"
    x = float(x)
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    if x == 0:
        return "0"
    if 1e-3 <= abs(x) < 1e4:
        return f"{x:.4g}"
    return f"{x:.3e}"


def render_table(headers: list[str], rows: list[list[str]], align: list[str]) -> str:
    """A plain-text table: ``headers`` above ``rows``, each column as wide as its widest cell, ``align`` per column
    (``"l"`` left, anything else right)."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    lines = []

    def line(cells):
        return "  ".join(c.ljust(w) if a == "l" else c.rjust(w) for c, w, a in zip(cells, widths, align)).rstrip()

    lines.append(line(headers))
    lines.append("  ".join("-" * w for w in widths))
    lines.extend(line(r) for r in rows)
    return "\n".join(lines)


def clip_left(text: str, width: int) -> str:
    """``text`` cut to ``width`` characters from the left, with an ellipsis: a layer name keeps its end."""
    return text if len(text) <= width else "…" + text[-(width - 1):]


def with_progress(batches: list, desc: str, progress: bool = True):
    """``batches`` behind a progress bar with an ETA on stderr (shown on a terminal only, never with --quiet)."""
    from tqdm import tqdm

    return tqdm(batches, desc=desc, unit="batch", leave=False, disable=None if progress else True)
