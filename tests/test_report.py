"""The sentences a chapter prints are computed from the results tables."""

import pandas as pd

from dalign_repro.report import describe as report
from dalign_repro.sweep import trend


def test_describe_runs_reports_failures_and_the_loss_trend():
    runs = pd.DataFrame(dict(width=[32, 64, 64], seed=[0, 0, 1], heldout_loss=[4.3, 4.1, 9.0],
                             trained_ok=[True, True, False]))
    text = report.describe_runs(runs)
    assert text.startswith("**1 of 3 runs failed**") and "N=64 seed 1" in text
    assert "N=32: 4.300, N=64: 4.100" in text and "falls with every increase" in text
    worse = runs.assign(heldout_loss=[4.0, 4.1, 9.0])
    assert "lowest at N=32" in report.describe_runs(worse)
    bumpy = pd.DataFrame(dict(width=[8, 12, 16, 24], seed=0, heldout_loss=[0.44, 0.40, 0.41, 0.37], trained_ok=True))
    text = report.describe_runs(bumpy)
    assert "lowest at the widest width" in text and "rises from N=12 to 16" in text and "not the best" not in text


def test_describe_learning_rates_flags_a_rate_at_the_edge_of_the_grid():
    lr = pd.DataFrame(dict(width=[32, 32, 64, 64, 128, 128], lr=[1e-3, 1e-2] * 3,
                           validation_loss=[5, 4, 4, 5, 4, 5], chosen=[False, True, True, False, True, False]))
    text = report.describe_learning_rates(lr)
    assert "N=32: 0.01, N=64: 0.001, N=128: 0.001" in text and "edge of that width's grid" in text
    assert "falls as width grows" in text


def _trend(late_lo, late_hi, judged=True):
    keys = dict(layer="L", pool="heldout", reduction="shared", judged=judged, n_runs=12, n_widths=4, detectable=0.4,
                reference=0.5)
    rows = [dict(quantity="d_align", view="late_window", slope=(late_lo + late_hi) / 2, slope_lo=late_lo,
                 slope_hi=late_hi, label=trend.label_for(late_lo, late_hi, 0.5), **keys)]
    rows += [dict(quantity="p_misalign", view="budget", setting="heldout/heldout", M=4, K=4, slope=-0.8,
                  slope_lo=-1.2, slope_hi=-0.4, label="reproduced", **{**keys, "reference": -0.5})]
    return pd.DataFrame(rows)


def test_width_verdicts_read_the_judged_rows():
    steps, matched_loss, misalignment = report.width_verdicts(_trend(0.1, 0.9), "L")
    assert steps.label == "reproduced" and "+0.50" in steps.sentence and "0.40 or more" in steps.sentence
    assert matched_loss.label == "not run"
    assert misalignment.label == "reproduced" and "(M, K) = (4, 4)" in misalignment.claim
    assert report.width_verdicts(_trend(-0.3, 0.2), "L")[0].label == "contradicted"
    assert report.width_verdicts(_trend(-0.3, 0.7), "L")[0].label == "inconclusive"
    assert report.width_verdicts(_trend(0.1, 0.9, judged=False), "L")[0].label == "not run"


def test_describe_bounds_counts_only_trained_runs_in_the_theorems_setting():
    table = pd.DataFrame(dict(
        setting=["heldout/heldout", "heldout/heldout", "train/heldout", "heldout/heldout"],
        p_misalign=[0.1, 0.3, 0.2, 0.9], p_misalign_lo=[0.08, 0.28, 0.18, 0.88], trials=1000,
        b_exact=[0.2, 0.25, float("nan"), 0.1], b_align=[0.3, 0.35, float("nan"), 0.1],
        trained_ok=[True, True, True, False]))
    text = report.describe_bounds(table)
    assert "2 estimates" in text and r"below $B_{\mathrm{exact}}$ in 50%" in text
    assert r"below $B_{\mathrm{align}}$ in 100%" in text
    assert "No trained run" in report.describe_bounds(table.assign(trained_ok=False))


def test_describe_learning_rates_says_when_every_rate_is_bracketed():
    lr = pd.DataFrame(dict(width=[32] * 3 + [64] * 3, lr=[1e-3, 3e-3, 1e-2, 5e-4, 1.5e-3, 5e-3],
                           validation_loss=[5, 4, 5, 5, 4, 5], chosen=[False, True, False] * 2))
    assert "Every kept rate lies inside its width's grid" in report.describe_learning_rates(lr)


def test_describe_rate_resolution_flags_widths_where_seeds_differ_as_much_as_rates():
    lr = pd.DataFrame(dict(width=[32] * 3 + [256] * 3, lr=[1e-3, 3e-3, 1e-2] * 2,
                           validation_loss=[4.5, 4.1, 4.3, 4.25, 4.24, 4.32], chosen=[False, True, False] * 2))
    runs = pd.DataFrame(dict(width=[32, 32, 256, 256], heldout_loss=[4.10, 4.12, 4.16, 4.21], trained_ok=True))
    text = report.describe_rate_resolution(lr, runs)
    assert "0.200, 0.010 nats of validation loss at N = 32, 256" in text and "0.020, 0.050 nats" in text
    assert "At N=256 the seeds differ more than the two best rates do" in text and "N=32 the" not in text


def test_runs_summary_has_one_narrow_row_per_width_and_no_missing_value():
    runs = pd.DataFrame(dict(width=[32, 32, 64], seed=[0, 1, 0], lr=[0.01, 0.01, 0.005], parameters=[1000, 1000, 4000],
                             heldout_loss=[4.2, 4.3, 4.1], trained_ok=[True, False, True]))
    table = report.runs_summary(runs)
    assert list(table.columns) == ["width N", "parameters", "learning rate", "held-out loss", "trained"]
    assert table.iloc[0].tolist() == [32, "1,000", "0.01", "4.250 (4.200–4.300)", "1 of 2"]
    assert table.iloc[1]["held-out loss"] == "4.100" and not table.isna().any().any()
    html = report.styled(pd.DataFrame({"a": [1.23456, float("nan")]})).to_html()
    assert "1.235" in html and "nan" not in html.lower() and report.DASH in html


def test_paper_comparison_is_three_full_columns():
    ours = pd.DataFrame(dict(width=[32, 32, 256, 256], d_align=[0.02, 0.04, 0.01, 0.01]))
    table = report.paper_comparison(ours, {512: 3.9, 3072: 9.5})
    assert list(table.columns) == ["", "paper", "ours: seed mean (range)"] and not table.isna().any().any()
    assert table["paper"].tolist()[-2:] == ["6", "2.4"] and table.iloc[-1, 2] == "0.33"
    nothing = report.paper_comparison(ours.iloc[:0], {512: 3.9, 3072: 9.5})
    assert nothing.shape[1] == 2  # nothing of ours: no column of empty cells


def test_describe_limiting_dimension_counts_lost_means_and_infinite_d_par_apart():
    geometry = pd.DataFrame(dict(layer="L", pool="heldout", step=10, trained_ok=True,
                                 mean_sq_sq=[1.0, 1.0, -1.0], d_par=[5.0, float("inf"), 0.0], d_2=[1.0, 2.0, 0.0],
                                 d_align=[1.0, 2.0, 0.0]))
    text = report.describe_limiting_dimension(geometry, "L", 10)
    assert "1 have an unbiased" in text and "Of the other 2, $d_2 \\le d_\\parallel$ in 2" in text
    assert "1 with a" in text and "ranges from 5 to 5" in text


def test_sentence_numbers_are_plain_or_powers_of_ten():
    assert report.number(0.0206) == "0.0206" and report.number(1234.5) == "1,234"
    assert report.number(5.86e-7) == "$5.86 \\times 10^{-7}$" and report.number(0) == "0"


def test_verdict_markdown_uses_math_and_code():
    from dalign_repro.sweep.trend import Verdict

    v = Verdict("d_align rises with width at model.layers.0 (heldout pool, matched steps)", "partly",
                "d_align rises with width at model.layers.0 (heldout pool, matched steps): partly. At (M, K).", 1, 0, 2)
    text = v.markdown()
    assert text.startswith("$d_{\\mathrm{align}}$ rises with width at `model.layers.0` (held-out pool")
    assert "**partly**" in text and "$(M, K)$" in text


def test_rerun_box_says_when_the_shown_run_loaded_trained_models():
    from dalign_repro.report.describe import rerun_box

    provenance = {"wall_time_s": 1131.0, "device": "cpu", "hardware": {"workers": 2, "threads_per_process": 1},
                  "sweeps": [{"runs": {"count": 12, "training_loaded": 12}}, {"runs": {"count": 4, "training_loaded": 4}}]}
    box = rerun_box("04_resnet_width", "resnet_width", "cpu", provenance)
    assert "took 18.9 min on cpu (2 worker processes of 1 thread each)." in box
    assert "loaded 16 of its 16 measured models from the checkpoints of an earlier one" in box
    fresh = rerun_box("04_resnet_width", "resnet_width", "cpu", {**provenance, "sweeps": [{"runs": {"count": 16}}]})
    assert "loaded" not in fresh and "python -m dalign_repro.experiments.resnet_width --profile cpu --force" in fresh
    one_sweep = {"wall_time_s": 600.0, "device": "cpu", "runs": {"count": 24, "training_loaded": 6}}  # LLaMA's shape
    assert "loaded 6 of its 24 measured models" in rerun_box("02_llama_width", "llama_width", "cpu", one_sweep)


def test_the_time_results_took_says_when_their_run_resumed_an_interrupted_one():
    from dalign_repro.report.describe import results_took

    hardware = {"workers": 2, "threads_per_process": 1}
    models = {"families": {"a": {"models": [{"seconds": 1500.0}, {"seconds": 900.0}, {"seconds": 7000.0,
                                                                                       "reused_from": "earlier"}]}}}
    fresh = {"wall_time_s": 1300.0, "device": "cpu", "hardware": hardware, **models}  # 2,400 worker-s on 2 workers
    assert results_took(fresh) == "21.7 min on cpu (2 worker processes of 1 thread each)"
    one = {"wall_time_s": 60.0, "device": "cpu", "hardware": {"workers": 1, "threads_per_process": 2}}
    assert results_took(one) == "1.0 min on cpu (1 worker process of 2 threads each)"
    short = {**fresh, "wall_time_s": 600.0}  # 2,400 worker-s cannot fit in 600 s on 2 workers
    assert results_took(short).endswith("its 2 models' jobs took 40.0 min of worker time in all, more than that "
                                        "wall time holds, so part of them ran in an earlier, interrupted sitting")
    resumed = {**short, "resumed": {"jobs_reused": 1, "jobs": 2}}
    assert ", resuming an interrupted run: 1 of its 2 jobs had finished before it started;" in results_took(resumed)
    assert "earlier, interrupted sitting" not in results_took(resumed)


def test_summarize_reads_each_regime_of_a_family_apart():
    """Pythia's two depth regimes are two sweeps: each gets its own runs, rates, rate check and verdicts."""
    from pathlib import Path

    text = report.summarize(Path(__file__).resolve().parents[1] / "results" / "cpu")
    pythia = text[text.index("== pythia"):text.index("== resnet")]
    assert "cpu" in pythia.splitlines()[0] and "None" not in pythia.splitlines()[0]
    shallow, deep = pythia.split("-- depth 12")
    assert "-- depth 6" in shallow and "gpt_neox.layers.2" in shallow and "gpt_neox.layers.5" not in shallow
    assert "gpt_neox.layers.5" in deep and "N=128" not in deep
    assert shallow.count("Learning rate kept per width") == deep.count("Learning rate kept per width") == 1


def _clock_geometry(crossing_slope: float, width_slope: float = 0.0, zeros: bool = False):
    """Runs whose log d_align falls 2 per log step at every width and whose loss falls faster the wider they are."""
    import math

    import numpy as np

    rng = np.random.default_rng(0)
    rows = []
    for width in (32, 64, 128):
        for seed in range(4):
            for step in (0, 100, 200, 300, 400, 500, 600):
                clock = step * (width / 32) ** crossing_slope
                value = 0.0 if zeros and step >= 400 else math.exp(
                    width_slope * math.log(width) - 2 * math.log(step + 1) + rng.normal(0, 0.1))
                rows.append(dict(width=width, seed=seed, step=step, layer="L", pool="heldout", reduction="shared",
                                 trained_ok=True, heldout_loss=6 - clock / 100, d_align=value,
                                 mean_sq_lo=-1.0 if zeros and step >= 400 else 0.1))
    return pd.DataFrame(rows)


def test_width_verdicts_from_geometry_take_the_clock_out_of_matched_loss():
    geometry = _clock_geometry(crossing_slope=0.5)  # wider runs reach every loss earlier; no width effect
    steps, matched_loss, _ = report.width_verdicts(_trend(-0.2, 0.2), "L", geometry=geometry, family="pythia",
                                                   scale=report.SCALE)
    assert matched_loss.label == "inconclusive" and "training clock removed" in matched_loss.claim
    assert matched_loss.sentence.startswith(matched_loss.claim + ": inconclusive at this scale.")
    assert "judged on its sign" in matched_loss.sentence and "**inconclusive at this scale**" in matched_loss.markdown()
    text = report.describe_clock(report.judged_geometry(geometry, _trend(-0.2, 0.2), "L"))
    assert "wider runs are read earlier" in text and "disagree here" in text
    # the plain crossing of the same runs would have read the clock as a rise with width
    from dalign_repro.sweep.clock import clock_diagnostics

    assert clock_diagnostics(geometry)["matched_lo"] > 0
    rises = report.width_verdicts(_trend(-0.2, 0.2), "L", geometry=_clock_geometry(0.5, 1.0), family="pythia")
    assert rises[0].label == rises[1].label == "reproduced"


def test_width_verdicts_say_not_estimable_where_the_mean_is_lost_in_noise():
    geometry = _clock_geometry(crossing_slope=0.0, zeros=True)
    steps, matched_loss, misalignment = report.width_verdicts(_trend(0.1, 0.9), "L", geometry=geometry,
                                                              family="resnet")
    assert steps.label == matched_loss.label == "not estimable" and "floor" in steps.sentence
    assert misalignment.label == "reproduced"  # p̂ does not need d_align: judged on its sign, below 0
    assert report.family_reference("pythia") == 0 and report.family_reference("llama") > 0.49


def test_a_studys_regime_names_each_familys_models_and_the_papers_beside_them():
    from dalign_repro.report.describe import models_regime, papers_regime_beside
    from dalign_repro.sweep.trend import PAPER_D_ALIGN

    assert models_regime("LLaMA", [256, 32, 64], [4.0, 4.0], 0.01122) == \
        "LLaMA at widths 32–256, 4 layers, median $d_{\\mathrm{align}}$ 0.0112"
    assert models_regime("ResNet-20", [8], [float("nan")]) == "ResNet-20 at width 8"  # no depth, no d_align read
    assert models_regime("Pythia", [32, 128], [6, 12, 6]).endswith("6 and 12 layers")
    small = models_regime("ResNet-20", [8, 24], (), 5.45e-6)
    assert small.endswith("median $d_{\\mathrm{align}}$ $5.45 \\times 10^{-6}$")
    beside = papers_regime_beside()
    assert "N = 512–3072" in beside and f"{PAPER_D_ALIGN[0]}–{PAPER_D_ALIGN[1]}" in beside
    assert beside.endswith("every verdict here is at this scale.")
