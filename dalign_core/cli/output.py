"""What every ``dalign`` subcommand prints alike: numbers in a few digits, plain-text tables, names clipped
to a width, progress bars with an ETA on stderr, and the ``--out`` CSV file."""

from __future__ import annotations

import csv
import io
import math
import os

__all__ = ["format_value", "render_table", "clip_left", "with_progress", "write_csv"]


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


def _csv_cell(value) -> str:
    """A CSV cell: empty for a missing value (None, NaN), ``repr`` for a float (every digit), ``str`` otherwise."""
    if value is None:
        return ""
    if isinstance(value, float):
        return "" if math.isnan(value) else repr(value)
    return str(value)


def write_csv(path: str | os.PathLike, rows: list[dict], columns: list[str] = ()) -> None:
    """Write ``rows`` (one dict each) to ``path`` as CSV: the header ``columns``, then every other key in the order
    the rows first show it; a key a row lacks, None and NaN are empty cells.

    With the standard library's ``csv`` (the core needs no pandas), under a temporary name renamed onto ``path``,
    so a reader never sees half a file and an interrupted write keeps the old one.
    """
    from dalign_core.atomic import atomic_write_text

    header = list(dict.fromkeys([*columns, *(key for row in rows for key in row)]))
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header)
    writer.writerows([_csv_cell(row.get(key)) for key in header] for row in rows)
    atomic_write_text(path, buffer.getvalue())


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
