"""The book's figures: clean tick labels, column width, and every figure drawn from empty tables too."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from dalign_repro.report import plots  # noqa: E402


def test_tick_labels_are_plain_numbers_or_powers_of_ten():
    assert [plots.tick_label(v) for v in (0, 0.02, 0.5, 1, 200, 4096, 1e4)] == [
        "0", "0.02", "0.5", "1", "200", "4,096", "10,000"]
    assert plots.tick_label(1e-5) == "$10^{-5}$" and plots.tick_label(2e-6) == "$2\\times10^{-6}$"
    assert plots.tick_label(0.040776) == "0.0408"  # never 4.0776×10⁻²


def test_style_sets_the_column_and_readable_fonts():
    """Figures are drawn 700 px wide (the book's column at 1280 px), and their smallest labels stay at 9 px and more
    when a phone shows them at its 390-px window's column (the browser test measures both)."""
    from dalign_repro.report import figure_style

    plots.style()
    rc = plt.rcParams
    assert rc["figure.figsize"][0] == plots.COLUMN_WIDTH
    assert rc["figure.dpi"] == rc["savefig.dpi"] == figure_style.DPI
    assert abs(plots.COLUMN_WIDTH * rc["figure.dpi"] - 700) <= 10, "a column-wide figure is 700 px"
    for key in ("font.size", "axes.labelsize", "xtick.labelsize", "ytick.labelsize", "legend.fontsize"):
        assert float(rc[key]) >= 10, key
        assert figure_style.shown_font_px(float(rc[key])) >= 9, f"{key} under 9 px on a phone"
    assert figure_style.shown_font_px(10, figure_width_in=9.5) < 9  # a figure wider than the column would not do


def _widths_figure_inputs():
    geometry = pd.DataFrame(columns=["width", "seed", "step", "pool", "layer", "trained_ok", "d_align", "d_align_lo",
                                     "d_align_hi", "mean_sq", "mean_sq_lo", "mean_sq_hi", "d_par", "d_par_lo",
                                     "d_par_hi", "d_2", "d_2_lo", "d_2_hi"])
    return geometry


@pytest.mark.parametrize("draw", [
    lambda g: plots.trajectory(g, "L"),
    lambda g: plots.final_geometry(g, "L", 10),
    lambda g: plots.final_geometry(g, "L", 10, ("d_par", "d_2")),
    lambda g: plots.layers_heatmap(g, 10),
])
def test_sweep_figures_draw_from_empty_tables_within_the_column(draw):
    plots.style()
    fig = draw(_widths_figure_inputs())
    assert fig.get_size_inches()[0] <= plots.COLUMN_WIDTH + 1e-9
    plt.close(fig)


def test_final_geometry_marks_infinite_estimates_and_uses_a_linear_axis_for_negatives():
    plots.style()
    g = pd.DataFrame(dict(width=[8, 8, 16, 16], seed=0, step=10, layer="L", pool=["heldout", "train"] * 2,
                          trained_ok=True, mean_sq=[-1e-3, 2e-3, 1e-3, 5e-4], d_par=[np.inf, 0.5, 0.4, 0.3],
                          d_2=[1e-5, 2e-5, 3e-5, 4e-5], d_align=[1e-5, 2e-5, 3e-5, 4e-5]))
    for name in ("mean_sq", "d_par", "d_2", "d_align"):
        g[f"{name}_lo"], g[f"{name}_hi"] = g[name], g[name]
    fig = plots.final_geometry(g, "L", 10, ("mean_sq", "d_par"))
    left, right = fig.axes[:2]
    assert left.get_yscale() == "linear" and right.get_yscale() == "log"
    assert any("= ∞" in t.get_text() for t in right.texts)
    plt.close(fig)


def test_certificate_by_budget_falls_with_the_budget():
    fig = plots.certificate_by_budget(0.05, 0.01)
    line = fig.axes[0].lines[0]
    assert np.all(np.diff(line.get_ydata()) <= 0)
    plt.close(fig)


def test_matched_loss_figure_draws_the_values_the_verdict_reads():
    from dalign_repro.sweep import trend

    rows = []
    for width, losses in {8: [3.0, 2.0, 1.5], 16: [3.0, 1.5, 1.0]}.items():
        for seed in (0, 1):
            for step, loss in zip((0, 10, 20), losses):
                rows.append(dict(width=width, seed=seed, step=step, layer="L", pool="heldout", heldout_loss=loss,
                                 d_align=(1 + seed) * np.exp(step / 10)))
    summaries = trend.matched_loss_summaries(pd.DataFrame(rows), "d_align", (0.0, 0.5), ["layer", "pool"])
    plots.style()
    fig = plots.matched_loss(summaries, "L")
    drawn = np.sort(np.concatenate([line.get_ydata() for line in fig.axes[0].lines if line.get_linestyle() == "None"]))
    np.testing.assert_allclose(drawn, np.sort(np.exp(summaries.y)))
    plt.close(fig)
    empty = plots.matched_loss(summaries.iloc[:0], "L")
    plt.close(empty)
