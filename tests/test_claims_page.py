"""The claims chapter's grid and headline (dalign_repro.claims.page), on a hand-made claims table."""

from __future__ import annotations

import math
import re

import pandas as pd

from dalign_repro.claims import page as claims_page
from dalign_repro.claims.table import NOT_RUN, RULES


def _row(claim, scope, verdict, chapter, slope=math.nan):
    return dict(claim=claim, scope=scope, paper="rises (§1)", ours="slope +0.10 <b>", verdict=verdict, chapter=chapter,
                slope=slope, slope_lo=slope - 0.5, slope_hi=slope + 0.5, detectable=0.8, rule=RULES.get(claim, ""))


def _table() -> pd.DataFrame:
    steps, loss, mis = list(RULES)[:3]
    return pd.DataFrame([
        _row(steps, "LLaMA", "inconclusive", "02_llama_width", 0.12),
        _row(steps, "Pythia, 6 layers", "contradicted", "03_pythia_width", -1.2),
        _row(steps, "Pythia, 12 layers", "reproduced", "03_pythia_width", 0.9),
        _row(steps, "ResNet-20, fashion-mnist", NOT_RUN, "04_resnet_width"),
        _row(loss, "LLaMA", NOT_RUN, "02_llama_width"),
        _row(loss, "ResNet-20", NOT_RUN, "04_resnet_width"),
        _row(mis, "LLaMA", "inconclusive", "02_llama_width", 0.0),
        _row("d_align from N = 512 to 3072", "LLaMA", NOT_RUN, "02_llama_width"),
        _row("empirical ≤ B_exact ≤ B_align", "LLaMA", "reproduced", "02_llama_width"),
        _row("certificates track the empirical rate", "ResNet-20, fashion-mnist", "not reproduced", "04_resnet_width"),
        _row("misalignment falls with M and K", "Pythia, 6 layers", "partly", "03_pythia_width"),
        _row("positive alignment predicts a decrease", "LLaMA", "reproduced", "05_interventions"),
        _row("retention at small steps", "ResNet-20", NOT_RUN, "05_interventions"),
    ])


def test_every_claim_of_the_table_has_a_group():
    assert {claims_page.claim_group(claim) for claim in RULES} == {"width", "theorem", "intervention", "growth"}
    assert claims_page.claim_group("something new") == "other"


def test_headline_counts_the_three_kinds_of_claim_apart():
    counts = claims_page.headline(_table())
    assert counts["width"] == {"inconclusive": 2, "contradicted": 1, "reproduced": 1, NOT_RUN: 4}
    assert counts["theorem"] == {"reproduced": 1, "not reproduced": 1, "partly": 1}
    assert counts["intervention"] == {"reproduced": 1, NOT_RUN: 1}
    text = claims_page.headline_text(_table(), "lab")
    lines = text.splitlines()
    assert len(lines) == 3
    assert lines[0].startswith("- **The paper's width claims** (8 claim × scope checks): 1 reproduced, 2 inconclusive, "
                               "1 contradicted; 4 not run at `lab`")
    assert "The theorem checks" in lines[1] and "The intervention claims" in lines[2]


def test_grid_has_a_coloured_linked_label_per_scope():
    page = claims_page.claims_grid_html(_table())
    assert page.count('class="dalign-claims"') == 1 and "<style>" in page
    assert "@media (max-width: 600px)" in page and 'html[data-theme="dark"]' in page  # phones and dark mode
    for family in claims_page.FAMILIES:
        assert f'<th scope="col">{family}</th>' in page
    for verdict in ("reproduced", "contradicted", "inconclusive", "partly", "not-reproduced"):
        assert f"verdict v-{verdict}" in page
        assert f".v-{verdict}" in page  # styled
    assert re.search(r'<a class="verdict v-contradicted" href="03_pythia_width.html"', page)
    assert '<span class="regime">6 layers</span>' in page and '<span class="regime">12 layers</span>' in page
    assert "slope -1.20 [-1.70, -0.70]" in page
    assert "&lt;b&gt;" in page and "<b>" not in page  # table text is escaped
    assert "d<sub>align</sub>" in page


def test_claims_with_nothing_run_are_folded_away():
    page = claims_page.claims_grid_html(_table())
    shown, folded = page.split("<details>")
    assert "matched steps" in shown and "matched loss" not in shown
    assert folded.startswith("<summary>3 claims not run at this profile</summary>")
    for claim in ("matched loss", "from <i>N</i> = 512 to 3072", "retention at small steps"):
        assert claim in folded
    everything_ran = _table()[lambda t: t.verdict != NOT_RUN]
    assert "<details>" not in claims_page.claims_grid_html(everything_ran)


def test_groups_head_their_rows_in_the_papers_order():
    page = claims_page.claims_grid_html(_table())
    shown = page.split("<details>")[0]
    positions = [shown.index(name) for name in ("The paper&#x27;s width claims", "The theorem checks",
                                                 "The intervention claims")]
    assert positions == sorted(positions)


def test_an_empty_table_says_so():
    assert "No claim was judged" in claims_page.claims_grid_html(pd.DataFrame(columns=list(_table().columns)))


def test_verdict_classes():
    assert claims_page.verdict_class(NOT_RUN) == "v-not-run"
    assert claims_page.verdict_class("not reproduced") == "v-not-reproduced"


def test_each_family_states_its_regime_and_the_papers():
    """With the claims table's regime columns, the grid heads each family with the regime its verdicts were reached
    in and the paper's; a verdict that holds only at this scale is starred; without the columns nothing breaks."""
    table = _table().assign(regime="", paper_regime="", at_this_scale=False)
    table.loc[table.scope == "Pythia, 6 layers", "regime"] = "N = 32–128, 6 layers, context 64"
    table.loc[table.scope.str.startswith("Pythia"), "paper_regime"] = "pythia-14m to 70m, trained on the Pile"
    table.loc[table.verdict == "contradicted", "at_this_scale"] = True
    page = claims_page.claims_grid_html(table)
    grid = page.split('<div class="dalign-claims dalign-details">')[0]
    assert "Our regime (this profile)" in grid and "N = 32–128, 6 layers, context 64" in grid
    assert "The paper's regime" in grid and "pythia-14m to 70m, trained on the Pile" in grid
    assert "contradicted*" in grid and "A star marks a verdict that holds at this scale only." in grid
    assert "title=" not in page  # nothing is said only in a tooltip
    plain = claims_page.claims_grid_html(_table())
    assert "Our regime" not in plain and "The paper's regime" not in plain and "*" not in plain.split("</style>")[1]


def test_regime_text_is_built_from_the_columns_when_not_given():
    row = pd.Series(dict(widths="32/64/128/256", depth=2.0, context=128.0, train_tokens=1229347.0))
    assert claims_page.regime_text(row, "LLaMA") == "N = 32–256 (4 widths) · 2 layers · context 128 · 1.23M tokens seen"
    image = pd.Series(dict(widths="8/12/16", depth=20.0, image_size="32×32"))
    assert claims_page.regime_text(image, "ResNet-20") == "N = 8–16 (3 widths) · 20 layers · 32×32 images"
    assert claims_page.regime_text(pd.Series(dict(regime="as stated")), "LLaMA") == "as stated"
    assert claims_page.regime_text(pd.Series(dict(claim="x")), "LLaMA") == ""


def test_the_details_list_every_check_without_a_wide_table():
    page = claims_page.claims_details_html(_table())
    assert page.count("<dt>") == len(_table()) and "<table" not in page
    assert "slope -1.20 [-1.70, -0.70]" in page and "the evidence: the Pythia chapter" in page


def test_the_context_study_has_a_grid_of_its_own_under_the_families():
    import pandas as pd

    rows = pd.DataFrame([
        dict(claim="d_align rises with width (matched steps)", scope="LLaMA", verdict="contradicted",
             chapter="02_llama_width", paper="rises (§1)", ours="", rule=""),
        dict(claim="d_align rises with width (matched steps)", scope="LLaMA, context 512", verdict="reproduced",
             chapter="09_llama_context", paper="rises (§1)", ours="", rule=""),
    ])
    page = claims_page.claims_grid_html(rows)
    main, study = page.split('id="dalign-context-grid"')
    assert "context 512" not in main.split("</div>")[0]  # the families' grid keeps one LLaMA column
    assert "context 512" in study and "reproduced" in study


def test_checks_of_the_computation_have_a_grid_and_a_headline_line_of_their_own():
    table = _table().assign(section="claims", fail_chance=float("nan"), alternative="")
    check = table.claim == "misalignment falls with M and K"
    table.loc[check, ["section", "fail_chance", "alternative"]] = ["checks of the computation", 0.0, "the formula"]
    page = claims_page.claims_grid_html(table)
    grid, checks = page.split('id="dalign-checks-grid"')[0], page.split('id="dalign-checks-grid"')[1]
    assert "fails 0% under the formula" in checks and "not counted as reproductions" in checks
    assert 'class="verdict v-partly"' not in grid.split("<details")[0]  # not in the claims' grid
    assert 'class="verdict v-partly"' in checks
    lines = claims_page.headline_text(table, "lab").splitlines()
    assert len(lines) == 4 and "checks of the computation" in lines[-1] and "1 partly" in lines[-1]
    assert "partly" not in lines[1]  # not counted among the theorem checks
