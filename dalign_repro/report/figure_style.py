"""The book's figure style, shared by every chapter's figures: sizes, fonts, labels, ticks, colours, legends.

Figures are drawn for the book's 700-pixel column and stay readable on a 390-pixel phone: :data:`COLUMN_WIDTH`
inches wide at :data:`DPI` (700 px), fonts of :data:`MIN_FONT_PT` and more (:func:`style` sets them; call it once
per notebook), so that a column-wide figure shrunk to a phone's column (:data:`PHONE_COLUMN_PX`) still has labels
of at least 9 px (:func:`shown_font_px`; ``tests/test_browser.py`` measures it in the browser), math labels, and tick
labels written as plain numbers (``0.01``, ``200``) or powers of ten (``10^{-5}``), never as
``4.0776×10⁻²``. Runs that failed to train are drawn in grey (:data:`FAILED`) and labelled, never as
data points of a trend.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd

try:  # the figures need the plots extra (matplotlib, seaborn); the rest of dalign_core does not
    import matplotlib.pyplot as plt
    import seaborn as sns
except ImportError as err:  # pragma: no cover  (both are installed wherever the book is built)
    raise ImportError(f"dalign_repro.report.figure_style draws with matplotlib and seaborn, which are not installed "
                      f"({err}); install the plots extra: pip install 'dalign[plots]'") from err
from matplotlib.ticker import (FixedLocator, FuncFormatter, LogLocator, MaxNLocator, NullFormatter,
                               NullLocator, ScalarFormatter)

__all__ = ["LABELS", "NOISE_NAMES", "FAILED", "COLUMN_WIDTH", "DPI", "MIN_FONT_PT", "PHONE_COLUMN_PX", "RC",
           "shown_font_px", "style", "tick_label", "log_ticks", "value_axis",
           "ticks_at", "width_axis", "palette", "trained_mask", "legend", "legend_below", "failed_note", "natural",
           "empty"]


LABELS = {
    "d_align": r"$d_{\mathrm{align}}$", "d_par": r"$d_{\parallel}$", "d_2": r"$d_2$", "mean_sq": r"$\|\mu\|^2$",
    "mean_sq_sq": r"$\|\mu\|^4$", "directional": r"$\mu^\top\Sigma\mu$", "cov_energy": r"$\mathrm{tr}\,\Sigma^2$",
    "p_misalign": r"$\Pr(\mu_M^\top g_K \leq 0)$", "b_exact": r"$B_{\mathrm{exact}}$",
    "b_align": r"$B_{\mathrm{align}}$",
    "slope": r"slope of $\log d_{\mathrm{align}}$ on $\log N$",
}
NOISE_NAMES = {"gaussian": "Gaussian", "student_t": "Student-$t$, 5 d.o.f.", "rademacher": "Rademacher"}
FAILED = dict(color="0.6", lw=1, ls=":", alpha=0.8)
COLUMN_WIDTH = 5.0
"""Inches: at :data:`DPI`, the book's 700-px column (a 1280-px window less the sidebars)."""
DPI = 140
"""Dots per inch of every figure, on screen and saved: :data:`COLUMN_WIDTH` × DPI = 700 px."""
MIN_FONT_PT = 11.5
"""The smallest font of a figure (tick labels, legends, annotations): 22.4 px at :data:`DPI`, so a figure that a
legend widens to 830 px (the cpu book's widest are 810) still shows labels of 9 px on a phone's 336-px column."""
PHONE_COLUMN_PX = 358
"""The width a figure is shown at on a 390-px phone: the article's column less its margins (measured in Chromium,
sphinx-book-theme 1.3; ``tests/test_browser.py`` measures it again)."""
RC = {
    "figure.dpi": DPI, "savefig.dpi": DPI, "figure.figsize": (COLUMN_WIDTH, 3.4),
    "figure.constrained_layout.use": True,
    "font.size": 11.5, "axes.titlesize": 12, "axes.labelsize": 11.5, "figure.titlesize": 12.5,
    "xtick.labelsize": MIN_FONT_PT, "ytick.labelsize": MIN_FONT_PT, "legend.fontsize": MIN_FONT_PT,
    "legend.title_fontsize": MIN_FONT_PT, "axes.formatter.use_mathtext": True, "lines.markersize": 5,
}
"""The matplotlib settings of the book: column-wide figures, no font under :data:`MIN_FONT_PT`."""


def shown_font_px(font_pt: float, figure_width_in: float = COLUMN_WIDTH, shown_px: float = PHONE_COLUMN_PX) -> float:
    """The height in screen pixels of a ``font_pt`` label of a figure ``figure_width_in`` inches wide at :data:`DPI`
    when the page shows it ``shown_px`` wide (a figure narrower than that is shown at its own size)."""
    natural_px = figure_width_in * DPI
    return font_pt / 72 * DPI * min(1.0, shown_px / natural_px)


def style() -> None:
    """Apply the book's figure style: seaborn's white grid, :data:`RC` (column width, :data:`DPI`, fonts >=
    :data:`MIN_FONT_PT`)."""
    sns.set_theme(context="notebook", style="whitegrid")
    plt.rcParams.update(RC)


def tick_label(value: float, _position=None) -> str:
    """A tick label: ``0``, a plain number between 0.001 and 100,000 (``0.02``, ``500``), else ``2×10^{-5}``."""
    if value == 0 or not np.isfinite(value):
        return "0" if value == 0 else ""
    size = abs(value)
    if 1e-3 <= size < 1e5:
        return f"{value:.3g}" if size < 1000 else f"{value:,.0f}"
    exponent = math.floor(math.log10(size) + 1e-9)
    mantissa = value / 10**exponent
    if abs(mantissa - round(mantissa)) < 1e-6 and round(abs(mantissa)) == 1:
        return f"${'-' if mantissa < 0 else ''}10^{{{exponent}}}$"
    return rf"${mantissa:.2g}\times10^{{{exponent}}}$"


def log_ticks(axis, values=None, numticks: int = 8) -> None:
    """Major ticks of a log axis at decades (1, 2, 5 × 10^k over a short range), labelled by :func:`tick_label`;
    at most about ``numticks`` of them (a narrow panel takes fewer: every other decade)."""
    values = np.asarray(values if values is not None else [], dtype=float)
    values = values[np.isfinite(values) & (values > 0)]
    span = values.max() / values.min() if len(values) else 1e3
    subs = (1.0,) if span >= 30 else (1.0, 2.0, 5.0) if span >= 4 else tuple(float(s) for s in range(1, 10))
    axis.set_major_locator(LogLocator(base=10, subs=subs, numticks=numticks))
    axis.set_major_formatter(FuncFormatter(tick_label))
    axis.set_minor_formatter(NullFormatter())


def value_axis(ax, values, axis: str = "y") -> None:
    """A log axis when every value is positive, else a linear one whose common power of ten sits at its end."""
    values = np.asarray(values, dtype=float)
    values = values[np.isfinite(values)]
    target = ax.yaxis if axis == "y" else ax.xaxis
    if len(values) and (values > 0).all():
        (ax.set_yscale if axis == "y" else ax.set_xscale)("log")
        log_ticks(target, values)
    else:
        (ax.set_yscale if axis == "y" else ax.set_xscale)("linear")
        target.set_major_locator(MaxNLocator(5))
        formatter = ScalarFormatter(useMathText=True)
        formatter.set_powerlimits((-2, 3))
        target.set_major_formatter(formatter)


def ticks_at(axis, values) -> None:
    """Ticks labelled at exactly ``values`` (widths, contexts) on a log axis, no minor ticks."""
    axis.set_major_locator(FixedLocator(sorted(set(values))))
    axis.set_major_formatter(FuncFormatter(tick_label))
    axis.set_minor_locator(NullLocator())


def width_axis(ax, widths) -> None:
    ax.set_xscale("log", base=2)
    ticks_at(ax.xaxis, widths)
    ax.set_xlabel("width $N$")


def palette(widths) -> dict:
    widths = sorted(set(widths))
    return dict(zip(widths, sns.color_palette("viridis", len(widths))))


def trained_mask(table: pd.DataFrame) -> pd.Series:
    return table.trained_ok.astype(bool) if "trained_ok" in table else pd.Series(True, index=table.index)


def legend(ax, ncols: int = 2, **kwargs) -> None:
    """The legend of a one-panel figure, below the axes so that it never hides data; none if nothing is labelled."""
    legend_below(ax.figure, ax, ncols=ncols, **kwargs)


def legend_below(fig, axes, ncols: int = 3, **kwargs) -> None:
    """One legend for the whole figure, below the axes: one entry per label across panels.

    At most ``ncols`` columns, and fewer where the entries would not fit the figure's width: a legend wider than the
    figure would widen the saved image past the column (and shrink its labels on a phone)."""
    labelled: dict = {}
    for ax in np.atleast_1d(axes).flat:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            if not label.startswith("_"):
                labelled.setdefault(label, handle)
    if not labelled:
        return
    renderer = fig.canvas.get_renderer()
    for columns in range(min(ncols, len(labelled)), 0, -1):
        shown = fig.legend(labelled.values(), labelled.keys(), loc="outside lower center", ncols=columns, **kwargs)
        if columns == 1 or shown.get_window_extent(renderer).width <= fig.bbox.width:
            return
        shown.remove()


def failed_note(ax, count: int) -> None:
    if count:
        ax.plot([], [], **FAILED, label=f"failed run ({count})")


def natural(name: str):
    """Sort key that puts ``layers.2`` before ``layers.10``."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", str(name))]


def empty(ax, text: str = "no trained run") -> None:
    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", color="0.5")
