"""The claims table: computed from results files, "not run" where they are missing, never typed."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from dalign_repro.claims import rows as claim_rows
from dalign_repro.claims import table as claims
from dalign_repro.claims import width as width_claims
from dalign_repro.studies import growth
from dalign_repro.report import describe as report
from dalign_repro.sweep import trend
from dalign_repro.config import REPO_ROOT
from dalign_repro.experiments import claims as claims_experiment
from dalign_repro.experiments._runner import run_experiment
from dalign_repro.experiments.llama_width import Config as LlamaConfig
from dalign_repro.studies.interventions.draws import FAMILY_NAMES
from dalign_repro.report.describe import width_verdicts

LABELS = {*trend.VOCABULARY, claims.NOT_RUN} - {"not run"}  # one vocabulary; "not run" reads "… at this profile"
CPU = REPO_ROOT / "results" / "cpu"


def _write(folder, name, frame, config=None):
    config = config or LlamaConfig.for_profile("smoke")
    run_experiment(name, (name,), config, lambda c, out: ({name: frame}, {}), out_dir=folder, force=True)


def test_an_empty_folder_gives_every_claim_as_not_run(tmp_path):
    table = claims.claims_table(tmp_path)
    assert set(table.verdict) == {claims.NOT_RUN}
    assert set(table.claim) == set(claims.RULES)  # every claim of the paper has a row, and a rule
    assert table.rule.notna().all()


@pytest.mark.skipif(not (CPU / "llama_trend.csv").exists(), reason="the committed cpu results are not present")
def test_the_committed_cpu_results_are_judged_by_the_chapters_own_verdicts(committed_cpu_claims_table):
    table = committed_cpu_claims_table
    assert set(table.verdict) <= LABELS
    trend = pd.read_csv(CPU / "llama_trend.csv")
    layer = pd.read_csv(CPU / "llama_misalignment.csv").layer.iloc[0]
    geometry = pd.read_csv(CPU / "llama_geometry.csv")
    step, loss, budget = width_verdicts(trend, layer, geometry=geometry, family="llama")
    llama = table[table.scope == "LLaMA"].set_index("claim").verdict
    def label(judged):
        return claims.NOT_RUN if judged.label == "not run" else judged.label

    assert llama["d_align rises with width (matched steps)"] == label(step)
    assert llama["d_align rises with width (matched loss)"] == label(loss)
    assert llama["misalignment falls with width at fixed (M, K)"] == label(budget)
    assert llama["d_align from N = 512 to 3072"] == claims.NOT_RUN  # the paper's widths are not trained at cpu
    if (CPU / "growth.csv").exists():  # the growth claim, ours: one row per family, growth.decision's label
        grown = pd.read_csv(CPU / "growth.csv")
        scores = growth.score(grown, ["d_align", "grad_norm"])
        rows = table[table.claim == growth.CLAIM].set_index("scope")
        assert set(rows.paper.str.startswith("not a claim of the paper")) == {True}
        for family, name in FAMILY_NAMES.items():
            judged = growth.decision(grown, family=family)
            assert rows.verdict[name] == label(judged) and judged.reason in rows.ours[name]
            rho = growth.verdict(scores, family=family)  # the ρ difference, stated beside the decision, not judged
            assert f"ρ difference (d_align − gradient norm) {rho.slope:+.2f}" in rows.ours[name]
            assert not np.isfinite(rows.slope[name])  # a grid that shows slopes shows none for growth


def _geometry(d512: float, d3072: float) -> pd.DataFrame:
    return pd.DataFrame(dict(family="llama", model=["a", "b"], width=[512, 3072], seed=0, step=10, pool="heldout",
                             layer="model.layers.3", trained_ok=True, d_align=[d512, d3072]))


@pytest.mark.parametrize("values, label", [((4.1, 9.0), "reproduced"), ((4.0, 5.0), "partly"),
                                           ((6.0, 5.0), "contradicted")])
def test_the_headline_llama_numbers_are_compared_with_the_paper(tmp_path, values, label):
    _write(tmp_path, "llama_geometry", _geometry(*values))
    _write(tmp_path, "llama_misalignment", _misalignment([0.5, 0.45, 0.4]).assign(layer="model.layers.3"))
    row = claims.claims_table(tmp_path).set_index("claim").loc["d_align from N = 512 to 3072"]
    assert row.verdict == label and row.ours == f"{values[0]:.3g} → {values[1]:.3g}"


def _misalignment(b_exact_values, fresh=None):
    """Misalignment rows of one LLaMA model per value: the pool's own p̂ (heldout/heldout) and p̂ on fresh
    examples (evaluation/evaluation, ``fresh`` when given, else the pool's), with the pool's certificates."""
    rows = []
    for model, b_exact in enumerate(b_exact_values):
        for M, p, lo, hi in ((4, 0.30, 0.25, 0.35), (64, 0.05, 0.03, 0.07)):
            row = dict(family="llama", model=f"m{model}", width=32 * (model + 1), seed=0, layer="model.layers.0",
                       setting="heldout/heldout", M=M, K=M, p_misalign=p - 0.01 * model, p_misalign_lo=lo,
                       p_misalign_hi=hi, b_exact=b_exact * (1 if M == 4 else 0.3), b_align=0.9, trained_ok=True)
            rows.append(row)
            rows.append({**row, "setting": "evaluation/evaluation",
                         **({} if fresh is None else dict(p_misalign=fresh, p_misalign_lo=fresh, p_misalign_hi=fresh))})
    return pd.DataFrame(rows)


MANY = [0.49 - 0.01 * i for i in range(12)]  # 12 models, 24 informative cells (B_exact below 0.5)


def test_certificate_claims_follow_their_rules(tmp_path):
    _write(tmp_path, "llama_misalignment", _misalignment(MANY))
    llama = claims.claims_table(tmp_path)[lambda t: t.scope == "LLaMA"].set_index("claim")
    assert llama.loc["empirical ≤ B_exact ≤ B_align"].verdict == "reproduced"  # 24 of 24 covered on fresh p̂
    assert llama.loc["misalignment falls with M and K"].verdict == "reproduced"
    # p̂ on fresh examples falls across models and so does B_exact: it tracks them
    assert llama.loc["certificates track the empirical rate"].verdict == "reproduced"
    # fresh examples misaligned far more often than the certificates allow: the bound fails out of sample
    _write(tmp_path, "llama_misalignment", _misalignment(MANY, fresh=0.6))
    llama = claims.claims_table(tmp_path)[lambda t: t.scope == "LLaMA"].set_index("claim")
    assert llama.loc["empirical ≤ B_exact ≤ B_align"].verdict == "contradicted"
    assert "0 of 24 informative cells" in llama.loc["empirical ≤ B_exact ≤ B_align"].ours
    # three models: too few cells to decide either way
    _write(tmp_path, "llama_misalignment", _misalignment([0.49, 0.45, 0.4]))
    llama = claims.claims_table(tmp_path)[lambda t: t.scope == "LLaMA"].set_index("claim")
    assert llama.loc["empirical ≤ B_exact ≤ B_align"].verdict == "inconclusive"
    # certificates of 0.5 or more certify nothing: counted apart, never as support
    _write(tmp_path, "llama_misalignment", _misalignment([1.7, 1.8, 2.0]))
    llama = claims.claims_table(tmp_path)[lambda t: t.scope == "LLaMA"].set_index("claim")
    row = llama.loc["empirical ≤ B_exact ≤ B_align"]
    assert row.verdict == "inconclusive" and "no informative cell" in row.ours
    # ... nor do they track: certificates that all say "1" may rank like p̂, and still certify nothing
    row = llama.loc["certificates track the empirical rate"]
    assert row.verdict == "inconclusive" and "certify nothing" in row.ours
    # a budget whose median certificate is uninformative is left out of the ranking; the other one still counts
    _write(tmp_path, "llama_misalignment", _misalignment([0.9 - 0.01 * i for i in range(12)]))
    row = claims.claims_table(tmp_path)[lambda t: t.scope == "LLaMA"].set_index("claim").loc[
        "certificates track the empirical rate"]
    assert row.verdict == "reproduced" and "the 1 of 2 budgets" in row.ours
    # without fresh examples (tables of an older design) the claim is not run, never judged in-sample
    _write(tmp_path, "llama_misalignment", _misalignment(MANY).query("setting == 'heldout/heldout'"))
    llama = claims.claims_table(tmp_path)[lambda t: t.scope == "LLaMA"].set_index("claim")
    assert llama.loc["empirical ≤ B_exact ≤ B_align"].verdict == claims.NOT_RUN


def test_the_experiment_writes_the_table_and_the_tables_it_read(tmp_path):
    _write(tmp_path, "llama_misalignment", _misalignment([0.5, 0.45, 0.4]))
    out = claims_experiment.run(claims_experiment.Config.for_profile("smoke"), out_dir=tmp_path)
    written = pd.read_csv(out / "claims.csv")
    assert len(written) == len(claims.claims_table(tmp_path))
    provenance = json.loads((out / "claims.json").read_text())
    assert set(provenance["inputs"]) == {"code", "llama_misalignment"}
    # reused while nothing changed; recomputed once an input table is rewritten
    config = claims_experiment.Config.for_profile("smoke")
    claims_experiment.run(config, out_dir=tmp_path)
    assert json.loads((out / "claims.json").read_text())["written_utc"] == provenance["written_utc"]
    _write(tmp_path, "llama_misalignment", _misalignment(MANY, fresh=0.6))
    claims_experiment.run(config, out_dir=tmp_path)
    again = pd.read_csv(out / "claims.csv").set_index(["claim", "scope"]).verdict
    assert again[("empirical ≤ B_exact ≤ B_align", "LLaMA")] == "contradicted"


def test_every_profile_lines_up_regimes_and_marks_what_did_not_run(tmp_path):
    _write(tmp_path, "llama_misalignment", _misalignment(MANY))
    cpu = claims.claims_table(tmp_path)
    cpu.loc[cpu.scope == "Pythia", "scope"] = "Pythia, 6 layers"  # as if Pythia had run at cpu
    empty = claims.claims_table(tmp_path / "nothing")
    table = claims.by_profile({"cpu": cpu, "gpu": empty})
    assert not ((table.scope == "Pythia") & table.claim.isin(cpu.claim)).any()  # the regime row stands for it
    row = table[(table.claim == "empirical ≤ B_exact ≤ B_align") & (table.scope == "LLaMA")].iloc[0]
    assert (row.cpu, row.gpu) == ("reproduced", claims.NOT_RUN)
    assert list(dict.fromkeys(table.claim)) == [c for c in claims.RULES if c in set(table.claim)]  # the paper's order


def test_tables_of_an_earlier_design_are_not_judged(tmp_path):
    """A table whose config is not the profile's current one reads "not run", and says why."""
    from dataclasses import replace

    from dalign_repro.claims.table import STALE, claims_table
    from dalign_repro.experiments import resnet_width
    from dalign_repro.report.results import write_table

    folder = tmp_path / "smoke"
    trend = pd.DataFrame({"quantity": ["d_align"], "view": ["late_window"], "dataset": ["synthetic"]})
    misalignment = pd.DataFrame({"setting": ["heldout/heldout"], "dataset": ["synthetic"], "trained_ok": [True]})
    earlier = replace(resnet_width.Config.for_profile("smoke"), seeds=3)
    write_table(trend, folder, "resnet_trend", earlier, 1.0)
    write_table(misalignment, folder, "resnet_misalignment", earlier, 1.0)
    rows = claims_table(folder)
    resnet = rows[rows.scope.str.startswith("ResNet") & (rows.chapter == "04_resnet_width")]
    assert (resnet.verdict == "not run at this profile").all() and (resnet.ours == STALE).all()
    current = resnet_width.Config.for_profile("smoke")
    write_table(trend, folder, "resnet_trend", current, 1.0)
    assert not claim_rows.is_stale(folder, "resnet_trend") and claim_rows.is_stale(folder, "resnet_misalignment")
    assert claim_rows.read_current(folder, "resnet_trend") is not None
    assert claim_rows.read_current(folder, "resnet_misalignment") is None


WIDTH_CLAIMS = [claim for claim, _, _ in width_claims._WIDTH_CLAIMS]


@pytest.mark.skipif(not (CPU / "llama_trend.csv").exists(), reason="the committed cpu results are not present")
def test_every_width_row_states_its_regime_and_its_own_reference(committed_cpu_claims_table):
    table = committed_cpu_claims_table
    width = table[table.claim.isin(WIDTH_CLAIMS) & (table.verdict != claims.NOT_RUN)]
    assert len(width) >= 12
    for row in width.itertuples():
        family = row.scope.split(",")[0]
        name = {'LLaMA': 'llama', 'Pythia': 'pythia', 'ResNet-20': 'resnet'}[family]
        if row.chapter == "09_llama_context":  # the context study: one regime per context, its trained widths
            runs = pd.read_csv(CPU / "llama_context_runs.csv")
            runs = runs[(runs.context == int(row.context)) & runs.trained_ok.astype(bool)]
            if runs.width.nunique() < 2:
                assert row.verdict == "not estimable" and "beat the bigram baseline" in row.ours
                continue
            geometry = runs
        else:
            geometry = pd.read_csv(CPU / f"{name}_geometry.csv")
        if family == "Pythia":
            geometry = geometry[geometry.depth == int(row.depth)]
        assert row.widths == "/".join(map(str, sorted(geometry.width.unique())))  # read from the results files
        assert row.epochs > 0 and row.d_align_median > 0 and row.paper_regime and row.regime
        if family == "ResNet-20":
            assert row.image_size == "32×32" and math.isnan(row.train_tokens) and row.depth == 20
        else:
            assert row.context > 0 and row.train_tokens > 1e5 and row.depth > 0
        # a family is judged against its own claim: only LLaMA has the paper's number
        if family == "LLaMA":
            if "d_align" in row.claim:
                assert row.reference.startswith("slope +0.50")
            else:  # the p̂ slope the paper's +0.50 implies at this design's (M, K) and B_exact (Gaussian tail)
                _assert_derived_reference(row)
        elif "d_align" in row.claim:
            assert row.reference.startswith("sign: ")
        else:
            _assert_derived_reference(row)
        # the regime is not the paper's at cpu (widths below the paper's): every label says so, on the page and in ours
        assert row.at_this_scale and row.shown == f"{row.verdict} at this scale" and "at this scale" in row.ours
    # Pythia is judged on the sign: the old +0.50 bound made an interval holding 0 read "contradicted"
    pythia = width[width.scope == "Pythia, 6 layers"].set_index("claim")
    steps = pythia.loc["d_align rises with width (matched steps)"]
    assert steps.slope_lo < 0 < steps.slope_hi and steps.verdict == "inconclusive"


def _assert_derived_reference(row):
    """The misalignment row's reference is the median over its judged cells of −(β/2) z φ(z) / (p(1 − p)),
    z = √((1 − B_exact)/B_exact), p = Φ(−z), β = +0.50: recomputed here from the misalignment table."""
    from scipy import stats

    name = {'LLaMA': 'llama', 'Pythia': 'pythia', 'ResNet-20': 'resnet'}[row.scope.split(",")[0]]
    name = "llama_context" if row.chapter == "09_llama_context" else name
    cells = pd.read_csv(CPU / f"{name}_misalignment.csv")
    for column in ("depth", "context"):
        if column in cells and np.isfinite(getattr(row, column)) and name != "llama":
            cells = cells[cells[column] == getattr(row, column)]
    M, K = (int(v) for v in row.reference.split("(M, K) = (")[1].split(")")[0].split(", "))
    cells = cells[(cells.setting == "heldout/heldout") & cells.trained_ok.astype(bool) & (cells.M == M)
                  & (cells.K == K)]
    cells = cells[cells.layer == cells.layer.iloc[0]]
    z = np.sqrt((1 - cells.b_exact) / cells.b_exact)
    p = stats.norm.sf(z)
    implied = float(np.median(-(trend.PAPER_SLOPE / 2) * z * stats.norm.pdf(z) / (p * (1 - p))))
    assert row.reference.startswith(f"slope {implied:+.2f} of logit p̂") and row.reference_slope == pytest.approx(implied)
    assert "Gaussian" in row.reference and "B_exact" in row.reference


def test_a_test_that_reduces_to_another_is_reported_once(tmp_path):
    """Where the matched-loss width term equals the late-window slope to every digit (noise that does not depend on
    width, two widths), the claims table holds one row for the two, which names the other and says why."""
    _context_tables(tmp_path, {16: 1.0, 32: -1.0}, width_noise=False)
    table = claims.claims_table(tmp_path)
    for context in (16, 32):
        rows = table[table.scope == f"LLaMA, context {context}"]
        assert len(rows) == 2 and "d_align rises with width (matched loss)" not in set(rows.claim)
        kept = rows.set_index("claim").loc["d_align rises with width (matched steps)"]
        assert kept.same_as == "d_align rises with width (matched loss)" and "reported once" in kept.ours
    # the general rule: no two rows of one scope carry the same estimate and interval
    judged = table[np.isfinite(table.slope)]
    assert not judged.duplicated(["scope", "slope", "slope_lo", "slope_hi"]).any()


def test_a_regime_that_is_the_papers_has_no_scale_mark():
    assert report.at_this_scale("llama", [32, 256]) and not report.at_this_scale("llama", [512, 1024, 3072])
    assert not report.at_this_scale("pythia", [128, 256, 512], depth=6)
    assert report.at_this_scale("pythia", [128, 256, 512], depth=12) and report.at_this_scale("pythia", [32], depth=6)
    assert report.at_this_scale("resnet", [16, 32], dataset="fashion-mnist", epochs=200)
    assert report.at_this_scale("resnet", [16, 32], dataset="cifar10", epochs=0.6)
    assert not report.at_this_scale("resnet", [16, 32], dataset="cifar10", epochs=200)
    row = claims.Row("c", "LLaMA", "p", "o", "contradicted", "x", at_this_scale=False)
    assert row.shown == "contradicted"
    assert claims.Row("c", "LLaMA", "p", "o", claims.NOT_RUN, "x", at_this_scale=True).shown == "not run"


@pytest.mark.skipif(not (CPU / "resnet_geometry.csv").exists(), reason="the committed cpu results are not present")
def test_no_width_verdict_depends_on_the_floor_under_the_log(monkeypatch, committed_cpu_claims_table):
    """ResNet-20's ‖μ‖² interval holds 0 at most late checkpoints: "not estimable" at any floor; LLaMA and Pythia's
    labels do not move either (their verdicts leave rows reading 0 out instead of flooring them). The committed
    claims table is judged at the library's floor (1e-6); its width rows are judged again here at 1e-9."""
    assert trend.FLOOR == 1e-6
    monkeypatch.setattr(trend, "FLOOR", 1e-9)
    floored = {(row.claim, row.scope): (row.verdict, f"{row.slope:.12g}") for row in width_claims.width_rows(CPU)
               if row.verdict != claims.NOT_RUN}
    at_default = committed_cpu_claims_table.set_index(["claim", "scope"])
    labels = {key: (at_default.verdict[key], f"{at_default.slope[key]:.12g}") for key in floored}
    assert len(floored) >= 6 and labels == floored
    resnet = {key: value for key, value in labels.items() if key[1].startswith("ResNet")}
    assert resnet[("d_align rises with width (matched steps)", "ResNet-20, fashion-mnist")][0] == "not estimable"
    assert resnet[("d_align rises with width (matched loss)", "ResNet-20, fashion-mnist")][0] == "not estimable"
    # ... while the floored late-window slope the sweep's trend table holds does move with the floor
    geometry = pd.read_csv(CPU / "resnet_geometry.csv")
    rows = report.judged_geometry(geometry, pd.read_csv(CPU / "resnet_trend.csv"), "layer2.2")
    late = report.late_steps(rows)
    slopes = {}
    for floor in (1e-5, 1e-8):
        monkeypatch.setattr(trend, "FLOOR", floor)
        slopes[floor] = trend.slope_test(trend.run_summaries(rows, "d_align", late))["slope"]
    assert abs(slopes[1e-5] - slopes[1e-8]) > 0.2


def _context_tables(folder, slopes: dict[int, float], width_noise: bool = True):
    """A context study's tables: per context, runs whose d_align rises with width by ``slopes[context]``.

    Without ``width_noise`` a run's noise depends on its seed and step alone, the same at every width: then the
    matched-loss width term and the late-window slope are the same test to every digit (two widths, balanced)."""
    from dalign_repro.experiments import llama_context
    from dalign_repro.sweep.run import trend_table

    config = llama_context.Config.for_profile("smoke")
    geometry, misalignment, trends = [], [], []
    for sweep in config.sweeps():
        rows = []
        for width in sweep.widths:
            for seed in range(3):
                for step in sweep.checkpoint_steps:
                    noise = (0.05 * math.sin(1.3 * width + 2.1 * seed + 0.7 * step) if width_noise
                             else 0.05 * ((seed * 7 + step) % 5 - 2))
                    rows.append(dict(family="llama_context", model=f"m{width}-{seed}", width=width, seed=seed,
                                     context=sweep.context, step=step, pool="heldout", layer="model.layers.0",
                                     reduction="shared", trained_ok=True, mean_sq=1.0, mean_sq_lo=0.5,
                                     heldout_loss=5 - 0.1 * step - 0.01 * width,
                                     d_align=0.01 * sweep.context * width ** slopes[sweep.context]
                                     * (step + 1) ** -0.5 * 2.718 ** noise))
        part = pd.DataFrame(rows)
        part = part.assign(d_par=part.d_align, d_2=part.d_align)
        mis = pd.DataFrame([dict(family="llama_context", model=f"m{w}-{s}", width=w, seed=s, context=sweep.context,
                                 layer="model.layers.0", setting="heldout/heldout", M=4, K=4, trials=1000,
                                 p_misalign=0.3 - 0.001 * w + 0.01 * s, p_misalign_lo=0.2, p_misalign_hi=0.4,
                                 b_exact=0.4, b_align=0.5, d_align=0.1, trained_ok=True)
                            for w in sweep.widths for s in range(3)])
        trends.append(trend_table(sweep, part, mis, "model.layers.0").assign(context=sweep.context))
        geometry.append(part)
        misalignment.append(mis)
    for name, frames in (("geometry", geometry), ("misalignment", misalignment), ("trend", trends)):
        _write(folder, f"llama_context_{name}", pd.concat(frames, ignore_index=True), config)
    return config


def test_the_context_study_gives_one_row_per_context_with_its_regime(tmp_path):
    before = claims.claims_table(tmp_path)
    idle = before[before.scope == "LLaMA, context study"]
    assert len(idle) == 3 and set(idle.verdict) == {claims.NOT_RUN}
    config = _context_tables(tmp_path, {16: 1.0, 32: -1.0})
    table = claims.claims_table(tmp_path)
    assert "LLaMA, context study" not in set(table.scope)
    for context, label in ((16, "reproduced"), (32, "contradicted")):
        rows = table[table.scope == f"LLaMA, context {context}"].set_index("claim")
        assert len(rows) == 3 and rows.context.eq(context).all()
        assert rows.widths.iloc[0] == "/".join(map(str, config.widths))
        row = rows.loc["d_align rises with width (matched steps)"]
        assert row.verdict == label and row.reference.startswith("slope +0.50")
        assert row.shown == f"{label} at this scale"  # N = 16-32 is not the paper's 512-3072
    # beside another profile, the context rows keep the family's own LLaMA row
    merged = claims.by_profile({"cpu": table, "gpu": claims.claims_table(tmp_path / "none")})
    assert ("d_align rises with width (matched steps)", "LLaMA, context 16") in set(zip(merged.claim, merged.scope))


def test_a_regime_whose_runs_failed_is_not_estimable_and_says_why():
    import pandas as pd

    from dalign_repro.claims.width import _untrained

    runs = pd.DataFrame(dict(width=[32, 32, 64, 64], trained_ok=[False, False, True, False]))
    assert "1 of 4 runs beat the bigram baseline (widths with a trained run: N = 64)" in _untrained(runs)
    assert "trained run: none" in _untrained(runs.assign(trained_ok=False))
    assert _untrained(runs.assign(trained_ok=True)) is None  # two trained widths: a slope can be fitted
    assert _untrained(runs.iloc[0:0]) is None  # nothing ran: "not run", not "not estimable"


def test_the_committed_context_study_reports_every_context_it_ran():
    from dalign_repro.config import REPO_ROOT
    from dalign_repro.report.results import read_table

    results = REPO_ROOT / "results" / "cpu"
    if not (results / "llama_context_runs.csv").exists():
        pytest.skip("the cpu context study has not been committed")
    claims = read_table(results, "claims")[0]
    contexts = set(read_table(results, "llama_context_runs")[0].context)
    scoped = claims[claims.chapter == "09_llama_context"]
    assert {f"LLaMA, context {t}" for t in contexts} == set(scoped.scope)
    assert "not run" not in " ".join(scoped.verdict)  # every context ran: a failed one is not estimable, not "not run"


def test_a_rule_that_can_barely_fail_is_a_check_with_its_chance_beside_it():
    """Coverage of p̂ far below B_exact passes for a certificate half as large too: a check (fail chance ~0); p̂ near
    the bound fails for that wrong certificate: a claim. The fall with M and K, drawn at each model's own moments,
    almost never fails where the moments differ between budgets, and always where they do not."""
    from dalign_repro.claims import checks

    rng = np.random.default_rng(0)
    cells = pd.DataFrame(dict(model=np.repeat([f"m{i}" for i in range(8)], 4), seed=0, b_exact=0.2))
    far = cells.assign(p_misalign=0.2 * rng.uniform(0.01, 0.04, len(cells)))
    near = cells.assign(p_misalign=0.2 * rng.uniform(0.8, 1.0, len(cells)))
    assert checks.coverage_fail_chance(far, 0.8) < checks.CAN_BARELY_FAIL
    assert checks.coverage_fail_chance(near, 0.8) > 0.8
    budgets = pd.DataFrame([dict(model=f"m{i}", seed=0, M=m, K=m, trials=2000, b_exact=b)
                            for i in range(6) for m, b in ((4, 0.6), (64, 0.08))])
    assert checks.budget_fail_chance(budgets) < 0.05
    assert checks.budget_fail_chance(budgets.assign(b_exact=0.6)) > 0.95


@pytest.mark.skipif(not (CPU / "llama_misalignment.csv").exists(), reason="the committed cpu results are not present")
def test_checks_of_the_computation_are_apart_and_not_counted_as_reproductions():
    from dalign_repro.claims import checks
    from dalign_repro.claims import page as claims_page
    from dalign_repro.claims.certificates import certificate_rows

    rows = pd.DataFrame([row.__dict__ for row in certificate_rows(CPU)])
    coverage = rows[rows.claim == "empirical ≤ B_exact ≤ B_align"].set_index("scope")
    # p̂ a median 2% of B_exact (LLaMA): a check; Pythia's p̂ at a third of it fails for half the certificate: a claim
    assert coverage.section["LLaMA"] == checks.CHECKS and coverage.fail_chance["LLaMA"] < checks.CAN_BARELY_FAIL
    judged = coverage[coverage.section == "claims"].fail_chance.dropna()
    assert len(judged) and (judged >= checks.CAN_BARELY_FAIL).all()
    assert (rows[rows.claim == "misalignment falls with M and K"].section == checks.CHECKS).all()
    counts = claims_page.headline(rows)
    assert counts["checks"]["reproduced"] >= 1
    assert sum(counts["theorem"].values()) + sum(counts["checks"].values()) == len(rows)
    assert "checks of the computation" in claims_page.headline_text(rows, "cpu")


def test_a_regime_with_fewer_than_two_trained_widths_says_so():
    from dalign_repro.claims.width import FEWER_THAN_TWO, _untrained

    runs = pd.DataFrame(dict(width=[32, 32, 64, 64], trained_ok=[False, False, True, True]))
    assert _untrained(runs).startswith(f"{FEWER_THAN_TWO}: 2 of 4 runs beat the bigram baseline")
