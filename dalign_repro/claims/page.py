"""The claims chapter at a glance: a grid of claim × family with coloured verdicts, and a headline.

:func:`claims_grid_html` turns a claims table (:func:`dalign_repro.claims.table.claims_table`) into
one self-contained HTML block: a row per claim, a column per family (LLaMA, Pythia,
ResNet-20), each cell one coloured label per scope (a depth regime or a data set), linked
to the chapter whose figures show the evidence. Above the claims, two rows state the regime each
family's verdicts were reached in (widths, depth, context or image size, training budget: the
claims table's ``widths``, ``depth``, ``context`` and ``train_tokens`` columns, where it has them)
and the paper's (its ``paper_regime`` column), so a verdict is never read without its scale. Rows
with nothing judged at the profile fold away into a ``<details>`` toggle. The grid is compact
enough to stand on one 1280 × 900 screen, and below 600 px (a phone's 390) each row becomes a
card with its family labels side by side. :func:`claims_details_html` is the full table (what the
paper reports, what we measured, the rule), folded, one card per row on a phone: nothing scrolls
sideways, and no text hides in a tooltip.
:func:`headline` counts the verdicts of the paper's width claims, the theorem checks and
the intervention claims separately.

Nothing here judges anything: the labels are the table's.
"""

from __future__ import annotations

import html
import math
from collections import Counter

import pandas as pd

from dalign_repro.studies import growth
from dalign_repro.claims.checks import CHECKS, CHECKS_HEADLINE
from dalign_repro.claims.table import NOT_RUN

__all__ = ["FAMILIES", "GROUPS", "VERDICTS", "claim_group", "claims_details_html", "claims_grid_html", "headline",
           "headline_text", "paper_regime_text", "regime_text", "verdict_class"]

GROUPS = {
    "width": ("the paper's width claims", (
        "d_align rises with width (matched steps)", "d_align rises with width (matched loss)",
        "misalignment falls with width at fixed (M, K)", "d_align from N = 512 to 3072")),
    "theorem": ("the theorem checks", (
        "empirical ≤ B_exact ≤ B_align", "certificates track the empirical rate", "misalignment falls with M and K")),
    "intervention": ("the intervention claims", (
        "positive alignment predicts a decrease", "retention at small steps", "retention on the same K examples")),
    "growth": ("the growth claim (ours, beyond the paper)", (growth.CLAIM,)),
}
"""Group key -> (its name in the headline, its claims in the paper's order)."""

FAMILIES = ("LLaMA", "Pythia", "ResNet-20")
"""The grid's columns: a scope's family is its name before the comma ("Pythia, 6 layers" -> Pythia)."""

VERDICTS = ("reproduced", "partly", "inconclusive", "contradicted", "not reproduced", "not estimable", NOT_RUN)
"""Every label, in the order the headline lists them."""

CHAPTER_NAMES = {"01_theory": "theory", "02_llama_width": "LLaMA", "03_pythia_width": "Pythia",
                 "04_resnet_width": "ResNet-20", "05_interventions": "interventions", "08_growth": "growth",
                 "09_llama_context": "LLaMA context"}

_SYMBOLS = (("d_align", "d<sub>align</sub>"), ("B_exact", "B<sub>exact</sub>"), ("B_align", "B<sub>align</sub>"),
            ("(M, K)", "(<i>M</i>, <i>K</i>)"), (" N = ", " <i>N</i> = "))

_STYLE = """
<style>
.dalign-claims { max-width: 100%; margin: 0.5rem 0 1rem; font-size: 0.85rem; line-height: 1.25; }
.dalign-claims table { width: 100%; table-layout: fixed; border-collapse: collapse; margin: 0; }
.dalign-claims th, .dalign-claims td { padding: 0.15rem 0.35rem; vertical-align: top; text-align: left;
  border-bottom: 1px solid rgba(128, 128, 128, 0.35); overflow-wrap: anywhere; word-break: normal; }
.dalign-claims thead th { font-weight: 600; border-bottom: 2px solid rgba(128, 128, 128, 0.6); }
.dalign-claims col.claim { width: 24%; }
.dalign-claims .group-note { text-transform: none; letter-spacing: 0; font-weight: normal; }
.dalign-claims th.group { padding-top: 0.45rem; font-size: 0.75rem; text-transform: uppercase; letter-spacing: 0.03em;
  opacity: 0.75; border-bottom: none; }
.dalign-claims tr.regime th, .dalign-claims tr.regime td { font-size: 0.7rem; line-height: 1.2; font-weight: normal;
  opacity: 0.9; }
.dalign-claims tr.regime td div + div { margin-top: 0.1rem; }
.dalign-claims .scope-label { display: block; margin-top: 0.05rem; }
.dalign-claims .verdict { display: inline-block; margin: 0 0.2rem 0.1rem 0; padding: 0 0.4rem;
  border-radius: 0.8rem; font-size: 0.75rem; line-height: 1.4; font-weight: 600; white-space: normal;
  text-decoration: none; border: 1px solid transparent; }
.dalign-claims a.verdict:focus, .dalign-claims a.verdict:hover { text-decoration: underline; }
.dalign-claims .regime { font-size: 0.72rem; opacity: 0.8; margin-right: 0.2rem; }
.dalign-claims .own-regime { display: block; font-size: 0.68rem; opacity: 0.75; }
.dalign-claims .slope { display: block; font-size: 0.68rem; opacity: 0.8; margin: 0 0 0.2rem; white-space: nowrap; }
.dalign-claims dl { margin: 0.2rem 0; }
.dalign-claims dt { font-weight: 600; }
.dalign-claims dd { margin: 0 0 0.3rem 0.8rem; }
.dalign-claims .v-reproduced { background: #d6f0dc; color: #14532d; border-color: #86c79a; }
.dalign-claims .v-partly { background: #fdf0c8; color: #6b4e00; border-color: #e3c35e; }
.dalign-claims .v-inconclusive { background: #e4e8ef; color: #27344a; border-color: #a8b3c4; }
.dalign-claims .v-contradicted { background: #f9d5d3; color: #7f1d1d; border-color: #e08e88; }
.dalign-claims .v-not-reproduced { background: #fbe0cc; color: #7c2d12; border-color: #e9a676; }
.dalign-claims .v-not-estimable { background: #eee6f5; color: #4a2a6a; border-color: #b9a3cf; }
html[data-theme="dark"] .dalign-claims .v-not-estimable { background: #33263f; color: #e2d3f2; border-color: #6e5389; }
.dalign-claims .v-not-run { background: transparent; color: inherit; opacity: 0.65; border: 1px dashed #999; }
html[data-theme="dark"] .dalign-claims .v-reproduced { background: #163d24; color: #b9efc8; border-color: #2f7a48; }
html[data-theme="dark"] .dalign-claims .v-partly { background: #3f3410; color: #f6dd8a; border-color: #8a6f1d; }
html[data-theme="dark"] .dalign-claims .v-inconclusive { background: #27303f; color: #d3dbe8; border-color: #56627a; }
html[data-theme="dark"] .dalign-claims .v-contradicted { background: #4a1b1b; color: #f8c4c0; border-color: #9a3b35; }
html[data-theme="dark"] .dalign-claims .v-not-reproduced { background: #47260f; color: #f7c9a6; border-color: #a0592a; }
.dalign-claims details { margin-top: 0.75rem; }
.dalign-claims summary { cursor: pointer; font-weight: 600; }
/* On a wide screen the grid takes the room of the page's right-hand contents column (which the claims page does
   without: book/_ext/dalign_publish.py), so that it stands on one screen. */
@media (min-width: 1200px) {
  #dalign-claims-grid { width: 136%; max-width: 136%; position: relative; z-index: 2; }
  .bd-article .cell_output:has(#dalign-claims-grid), .bd-article .output:has(#dalign-claims-grid) {
    overflow: visible; }
}
@media (max-width: 600px) {
  .dalign-claims table, .dalign-claims tbody, .dalign-claims tr, .dalign-claims td, .dalign-claims th { display: block;
    width: 100%; }
  .dalign-claims colgroup, .dalign-claims thead { display: none; }
  .dalign-claims tr { padding: 0.4rem 0; border-bottom: 1px solid rgba(128, 128, 128, 0.35); }
  .dalign-claims td, .dalign-claims th { border: none; padding: 0.1rem 0; }
  .dalign-claims td.family { display: inline-block; width: auto; max-width: 100%; margin-right: 0.6rem;
    vertical-align: top; }
  .dalign-claims td.family::before { content: attr(data-family); display: block; font-size: 0.75rem; opacity: 0.75; }
  .dalign-claims td.family:empty { display: none; }
  .dalign-claims .slope { white-space: normal; }
}
</style>
"""


def claim_group(claim: str) -> str:
    """"width", "theorem" or "intervention" for a claim of the table ("other" for one no group names)."""
    return next((key for key, (_, claims) in GROUPS.items() if claim in claims), "other")


def verdict_class(verdict: str) -> str:
    """The CSS class of a verdict's label: ``v-reproduced``, ``v-not-reproduced``, ``v-not-run`` ..."""
    return "v-not-run" if verdict == NOT_RUN else "v-" + "-".join(str(verdict).split())


def _family(scope: str) -> str:
    return str(scope).split(",")[0].strip()


def _regime(scope: str) -> str:
    head, _, rest = str(scope).partition(",")
    return rest.strip()


def _claim_html(claim: str) -> str:
    text = html.escape(claim)
    for plain, marked in _SYMBOLS:
        text = text.replace(html.escape(plain), marked)
    return text


REGIME_COLUMNS = ("regime", "widths", "depth", "context", "image_size", "train_tokens")
"""The claims table's columns that state the regime a verdict was reached in (read when present): ``regime`` in
words, else the line is built from the others."""
PAPER_REGIME_COLUMNS = ("paper_regime", "regime_paper", "paper_scale")
"""Where the claims table states the paper's regime for a row (the first of these it has)."""
IMAGE_FAMILIES = ("ResNet-20",)
"""Families whose context is an image size and whose training budget counts images, not tokens."""


def _present(value) -> bool:
    if value is None:
        return False
    if isinstance(value, float) and math.isnan(value):
        return False
    return str(value).strip() not in ("", "nan", "None")


def _count(value) -> str:
    """4900000 -> "4.9M", 120000 -> "120k"; text stays as it is."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return str(value)
    for size, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(number) >= size:
            return f"{number / size:.3g}{unit}"
    return f"{number:.3g}"


def _widths(value) -> str:
    text = str(value).strip().strip("[]()")
    parts = [p for p in text.replace(";", ",").replace("/", ",").replace(" ", ",").split(",") if p]
    try:
        numbers = sorted(int(float(p)) for p in parts)
    except ValueError:
        return f"N {text}"
    if len(numbers) > 1:
        return f"N = {numbers[0]}–{numbers[-1]} ({len(numbers)} widths)"
    return f"N = {numbers[0]}" if numbers else f"N {text}"


def regime_text(row, family: str = "") -> str:
    """One line, "N = 32–256 (4 widths) · 2 layers · context 64 · 4.9M tokens", from a claims row's regime columns
    (any subset of :data:`REGIME_COLUMNS`; "" when it has none)."""
    given = getattr(row, "regime", None)
    if _present(given):  # the claims table states it in words
        return str(given)
    image = family in IMAGE_FAMILIES
    parts = []
    widths, depth = getattr(row, "widths", None), getattr(row, "depth", None)
    context, budget = getattr(row, "context", None), getattr(row, "train_tokens", None)
    if _present(widths):
        parts.append(_widths(widths))
    if _present(depth):
        parts.append(f"{_count(depth)} layers" if str(depth).replace(".", "", 1).isdigit() else str(depth))
    if _present(context):
        parts.append(f"{'image' if image else 'context'} {_count(context)}")
    if _present(getattr(row, "image_size", None)):
        parts.append(f"{row.image_size} images")
    if _present(budget):
        parts.append(f"{_count(budget)} {'images' if image else 'tokens'} seen"
                     if str(budget).replace(".", "", 1).replace("e+", "", 1).isdigit() else str(budget))
    return " · ".join(parts)


def paper_regime_text(row) -> str:
    """The paper's regime for a claims row (its :data:`PAPER_REGIME_COLUMNS` value; "" when it has none)."""
    for column in PAPER_REGIME_COLUMNS:
        value = getattr(row, column, None)
        if _present(value):
            return str(value)
    return ""


def _at_this_scale(row) -> bool:
    value = getattr(row, "at_this_scale", None)
    if _present(value):
        return str(value).strip().lower() in ("true", "1", "yes")
    return "at this scale" in str(getattr(row, "shown", "") or "")


def _slope_text(row) -> str:
    value = getattr(row, "slope", math.nan)
    if str(row.verdict) == NOT_RUN or not isinstance(value, (int, float)) or math.isnan(value):
        return ""
    lo, hi = getattr(row, "slope_lo", math.nan), getattr(row, "slope_hi", math.nan)
    return f"{value:+.2f} [{lo:+.2f}, {hi:+.2f}]"


def _label(row, link: bool, family_regime: dict[str, str] | None = None) -> str:
    """One verdict of the grid: its scope's regime name, the coloured label (a star when it holds at this scale
    only), the slope and its interval under it, and its own regime where it differs from its scope's."""
    verdict = str(row.verdict)
    shown = "not run" if verdict == NOT_RUN else verdict
    star = "*" if verdict != NOT_RUN and _at_this_scale(row) else ""
    chapter = str(row.chapter) if isinstance(row.chapter, str) else ""
    css = f"verdict {verdict_class(verdict)}"
    hidden = (f'<span class="visually-hidden">{" at this scale" if star else ""} '
              f'({html.escape(CHAPTER_NAMES.get(chapter, chapter))} chapter)</span>') if chapter else ""
    if link and chapter:
        label = f'<a class="{css}" href="{html.escape(chapter)}.html">{html.escape(shown)}{star}{hidden}</a>'
    else:
        label = f'<span class="{css}">{html.escape(shown)}{star}{hidden}</span>'
    regime = _regime(row.scope)
    slope = _slope_text(row)
    slope = f'<span class="slope">{slope}</span>' if slope else ""
    # A row reached in another regime than its scope's (shown in the regime row above) says so under its label.
    own = regime_text(row, _family(row.scope))
    header = (family_regime or {}).get(str(row.scope), own)
    differs = f'<span class="own-regime">{html.escape(own)}</span>' if own and own != header else ""
    return ('<span class="scope-label">' + (f'<span class="regime">{html.escape(regime)}</span>' if regime else "")
            + label + "</span>" + slope + differs)


def _scope_regimes(table: pd.DataFrame) -> dict[str, str]:
    """Scope -> its regime line: the one most of its judged rows were reached in."""
    found: dict[str, str] = {}
    judged = table[table.verdict != NOT_RUN]
    for scope, part in (judged if len(judged) else table).groupby("scope", sort=False):
        lines = [regime_text(row, _family(scope)) for row in part.itertuples(index=False)]
        lines = [line for line in lines if line]
        if lines:
            found[str(scope)] = Counter(lines).most_common(1)[0][0]
    return found


def _paper_regimes(table: pd.DataFrame) -> dict[str, str]:
    """Family -> the paper's regime for it (the first row that states one)."""
    found: dict[str, str] = {}
    for row in table.itertuples(index=False):
        text = paper_regime_text(row)
        if text:
            found.setdefault(_family(row.scope), text)
    return found


def _regime_rows(table: pd.DataFrame, families: list[str]) -> str:
    """The two rows above the claims: our regime per family (one line per scope) and the paper's."""
    ours = _scope_regimes(table)
    paper = _paper_regimes(table)
    out = []
    if ours:
        cells = []
        for family in families:
            scopes = [scope for scope in dict.fromkeys(table.scope) if _family(scope) == family and scope in ours]
            inner = "".join(f"<div>{html.escape(_regime(scope) + ': ' if _regime(scope) and _regime(scope) not in ours[scope] else '')}"
                            f"{html.escape(ours[scope])}</div>" for scope in scopes)
            cells.append(f'<td class="family" data-family="{html.escape(family)}">{inner}</td>')
        star = (" A star marks a verdict that holds at this scale only." if any(
            _at_this_scale(row) for row in table.itertuples(index=False) if str(row.verdict) != NOT_RUN) else "")
        out.append(f'<tr class="regime"><th scope="row">Our regime (this profile).{star}</th>{"".join(cells)}</tr>')
    if paper:
        cells = "".join(f'<td class="family" data-family="{html.escape(family)}">'
                        f'{html.escape(paper.get(family, ""))}</td>' for family in families)
        out.append(f'<tr class="regime paper"><th scope="row">The paper\'s regime</th>{cells}</tr>')
    return "\n".join(out)


def _rows_html(table: pd.DataFrame, claims: list[str], families: list[str], link: bool,
               judged_only: bool = False) -> str:
    out = []
    regimes = _scope_regimes(table)
    if judged_only:  # the scopes not run for a judged claim are listed in the details below the grid
        table = table[table.verdict != NOT_RUN]
    for group in list(GROUPS) + ["other"]:
        in_group = [claim for claim in claims if claim_group(claim) == group]
        if not in_group:
            continue
        name = GROUPS[group][0] if group in GROUPS else "other claims"
        note = ('<span class="group-note"> · under each label: the slope of log d<sub>align</sub> (or logit p̂) '
                "on log <i>N</i>, with its 95% interval</span>") if group == "width" and judged_only else ""
        out.append(f'<tr><th class="group" colspan="{1 + len(families)}">{html.escape(name[0].upper() + name[1:])}'
                   f"{note}</th></tr>")
        for claim in in_group:
            rows = table[table.claim == claim]
            cells = []
            for family in families:
                part = rows[rows.scope.map(_family) == family]
                inner = "".join(_label(row, link, regimes) for row in part.itertuples(index=False))
                cells.append(f'<td class="family" data-family="{html.escape(family)}">{inner}</td>')
            out.append(f'<tr><th scope="row" class="claim">{_claim_html(claim)}</th>{"".join(cells)}</tr>')
    return "\n".join(out)


def _table_html(table: pd.DataFrame, claims: list[str], families: list[str], link: bool,
                regimes: bool = False) -> str:
    head = "".join(f'<th scope="col">{html.escape(f)}</th>' for f in families)
    cols = '<col class="claim">' + "<col>" * len(families)
    regime_rows = _regime_rows(table, families) if regimes else ""
    return (f"<table><colgroup>{cols}</colgroup><thead><tr><th scope=\"col\">Claim</th>{head}</tr></thead>"
            f"<tbody>\n{regime_rows}\n{_rows_html(table, claims, families, link, judged_only=regimes)}\n"
            "</tbody></table>")


def _families(table: pd.DataFrame) -> list[str]:
    present = [f for f in FAMILIES if (table.scope.map(_family) == f).any()]
    return present + [f for f in dict.fromkeys(table.scope.map(_family)) if f not in present]


def claims_grid_html(table: pd.DataFrame, link: bool = True, details: bool = True) -> str:
    """The grid of claim × family as one HTML block (its own ``<style>``); see the module docstring.

    ``link``: each label links to its chapter (``<chapter>.html``, beside this page in the book).
    Claims with no verdict at all but "not run" are listed under a ``<details>`` toggle, closed.
    ``details``: the full table follows, folded (:func:`claims_details_html`).
    """
    if table.empty:
        return '<div class="dalign-claims"><p>No claim was judged.</p></div>'
    # The context study varies one family's context, not the family: its rows get a grid of their own, one column
    # per context, under the families' grid (which then stays one screen tall).
    in_study = table.chapter == CONTEXT_CHAPTER if "chapter" in table else pd.Series(False, index=table.index)
    in_checks = table.section == CHECKS if "section" in table else pd.Series(False, index=table.index)
    checks = table[in_checks & ~in_study]
    study, table = table[in_study & ~in_checks], table[~in_study & ~in_checks]
    if table.empty:
        return context_grid_html(study, link)
    families = _families(table)
    claims = list(dict.fromkeys(table.claim))
    judged = [c for c in claims if (table[table.claim == c].verdict != NOT_RUN).any()]
    idle = [c for c in claims if c not in judged]
    parts = [_STYLE, '<div class="dalign-claims" id="dalign-claims-grid">']
    if judged:
        parts.append(_table_html(table, judged, families, link, regimes=True))
    if idle:
        parts.append(f"<details><summary>{len(idle)} claim{'s' if len(idle) > 1 else ''} not run at this profile"
                     "</summary>")
        parts.append(_table_html(table, idle, families, link))
        parts.append("</details>")
    parts.append("</div>")
    if not study.empty:
        parts.append(context_grid_html(study, link, style=False))
    if not checks.empty:
        parts.append(checks_grid_html(checks, link))
    if details:
        parts.append(claims_details_html(pd.concat([table, study, checks]), style=False))
    return "\n".join(parts)



CONTEXT_CHAPTER = "09_llama_context"
"""The chapter of the context study, whose rows :func:`claims_grid_html` shows in a grid of their own."""


def context_grid_html(study: pd.DataFrame, link: bool = True, style: bool = True) -> str:
    """The context study's width claims as a grid of claim × context (LLaMA at each context), with each context's
    regime above its column, as the families' grid shows theirs."""
    study = study.assign(scope=study.scope.str.replace(r"^[^,]*, ", "", regex=True))
    claims = list(dict.fromkeys(study.claim))
    return "\n".join([_STYLE if style else "", '<div class="dalign-claims" id="dalign-context-grid">',
                      "<p><strong>The context study</strong> (LLaMA at each context, the same tokens per step):</p>",
                      _table_html(study, claims, list(dict.fromkeys(study.scope)), link, regimes=True), "</div>"])


DETAIL_COLUMNS = (("paper", "The paper"), ("ours", "Ours"), ("d_align_median", "median d<sub>align</sub>"),
                  ("reference", "Reference"), ("rule", "Rule"))
"""The claims table's columns the folded details show under each (claim, scope), where present and filled."""


def claims_details_html(table: pd.DataFrame, summary: str = "Every check in full", style: bool = True) -> str:
    """The whole claims table, folded under ``summary``: per claim, one entry per scope with its verdict, the
    regime it was reached in beside the paper's, what the paper reports, what we measured and the rule.

    A definition list, not a wide table: it reads the same at 1280 px and on a phone, with nothing to scroll.
    """
    if table.empty:
        return '<div class="dalign-claims"><p>No claim was judged.</p></div>'
    parts = [_STYLE if style else "", f'<div class="dalign-claims dalign-details"><details class="dalign-all"><summary>{html.escape(summary)} '
             f"({len(table)} claim × scope checks)</summary>"]
    for claim in dict.fromkeys(table.claim):
        parts.append(f"<h4>{_claim_html(claim)}</h4><dl>")
        for row in table[table.claim == claim].itertuples(index=False):
            verdict = str(row.verdict)
            said = "not run" if verdict == NOT_RUN else str(row.shown) if _present(getattr(row, "shown", None)) else verdict
            parts.append(f'<dt>{html.escape(str(row.scope))}: <span class="verdict {verdict_class(verdict)}">'
                         f'{html.escape(said)}</span></dt>')
            facts = []
            ours, paper = regime_text(row, _family(row.scope)), paper_regime_text(row)
            if ours or paper:
                facts.append("<strong>Regime</strong>: " + html.escape(ours or "not stated")
                             + (f"; the paper's: {html.escape(paper)}" if paper else ""))
            slope = _slope_text(row)
            if slope:
                detect = getattr(row, "detectable", math.nan)
                facts.append(f"<strong>Slope</strong>: slope {slope} on log <i>N</i>"
                             + (f" (detects ≥ {detect:.2f})" if isinstance(detect, float) and detect == detect
                                else ""))
            for column, title in DETAIL_COLUMNS:
                value = getattr(row, column, None)
                if column == "rule" or not _present(value):
                    continue
                text = _count(value) if column == "d_align_median" else html.escape(str(value))
                facts.append(f"<strong>{title}</strong>: {text}")
            chapter = str(row.chapter) if isinstance(row.chapter, str) else ""
            if chapter:
                facts.append(f'<a href="{html.escape(chapter)}.html">the evidence: the '
                             f"{html.escape(CHAPTER_NAMES.get(chapter, chapter))} chapter</a>")
            parts.append("<dd>" + "<br>".join(facts) + "</dd>")
        rule = table[table.claim == claim].rule.iloc[0] if "rule" in table else ""
        parts.append("</dl>" + (f"<p><strong>Rule</strong>: {html.escape(str(rule))}</p>" if _present(rule) else ""))
    parts.append("</details></div>")
    return "\n".join(parts)


def headline(table: pd.DataFrame) -> dict[str, Counter]:
    """``{group: Counter(verdict -> rows)}`` for width, theorem, intervention and growth claims (rows: claim × scope);
    rows of the "checks of the computation" section (a ``section`` column) are counted under ``checks``, apart."""
    counts = {group: Counter() for group in GROUPS}
    for row in table.itertuples(index=False):
        group = CHECKS_HEADLINE[0] if getattr(row, "section", "claims") == CHECKS else claim_group(row.claim)
        counts.setdefault(group, Counter())[row.verdict] += 1
    return counts


def headline_text(table: pd.DataFrame, profile: str) -> str:
    """One Markdown sentence per group: "The paper's width claims (12 checks): 1 reproduced, 9 inconclusive ..."."""
    lines = []
    for group, counter in headline(table).items():
        total = sum(counter.values())
        if not total:
            continue
        name = GROUPS[group][0] if group in GROUPS else CHECKS_HEADLINE[1] if group == CHECKS_HEADLINE[0] else "other claims"
        judged = [f"{counter[v]} {v}" for v in VERDICTS if v != NOT_RUN and counter[v]]
        judged += [f"{counter[v]} {v}" for v in counter if v not in VERDICTS]
        idle = counter[NOT_RUN]
        text = ", ".join(judged) if judged else "none judged"
        if idle:
            text += f"; {idle} not run at `{profile}`"
        lines.append(f"- **{name[0].upper() + name[1:]}** ({total} claim × scope "
                     f"check{'s' if total > 1 else ''}): {text}.")
    return "\n".join(lines)


def chapter_verdicts_markdown(chapter: str, results_dir) -> str:
    """The verdicts of the claims table in ``results_dir`` that rest on ``chapter``, as a Markdown list for its
    takeaways ("- d_align rises with width (matched steps), Pythia, 6 layers: **inconclusive at this scale**"), or
    one sentence saying where they will be once the claims chapter has judged this profile."""
    from pathlib import Path

    path = Path(results_dir) / "claims.csv"
    table = pd.read_csv(path) if path.is_file() else pd.DataFrame(columns=["claim", "scope", "verdict", "chapter"])
    rows = table[(table.chapter == chapter) & (table.verdict != NOT_RUN)]
    if not len(rows):
        return ("The claims chapter states this chapter's verdicts once it has judged this profile's results "
                "({doc}`06_claims`).")
    lines = []
    for row in rows.itertuples(index=False):
        said = str(row.shown) if _present(getattr(row, "shown", None)) else str(row.verdict)
        claim = str(row.claim)
        for plain, math_text in (("d_align", "$d_{\\mathrm{align}}$"), ("B_exact", "$B_{\\mathrm{exact}}$"),
                                 ("B_align", "$B_{\\mathrm{align}}$"), ("(M, K)", "$(M, K)$")):
            claim = claim.replace(plain, math_text)
        lines.append(f"- {claim} ({row.scope}): **{said}**")
    return ("The verdicts this chapter's results give, as the claims chapter ({doc}`06_claims`) judged them at "
            "this profile:\n\n" + "\n".join(lines))


def checks_grid_html(checks: pd.DataFrame, link: bool = True) -> str:
    """The checks of the computation (rows whose ``section`` is :data:`dalign_repro.claims.checks.CHECKS`) as a grid
    of their own under the claims: rules that can barely fail, each label with its simulated chance of failing under
    the alternative the row states, never counted as a reproduction."""
    claims = list(dict.fromkeys(checks.claim))
    families = _families(checks)
    chances = [f"{html.escape(str(r.claim))} ({html.escape(str(r.scope))}): fails {r.fail_chance:.0%} under "
               f"{html.escape(str(r.alternative))}" for r in checks.itertuples(index=False)
               if isinstance(getattr(r, "fail_chance", None), float) and r.fail_chance == r.fail_chance]
    note = ("<p><strong>Checks of the computation</strong>: rules that can barely fail at this design, reported "
            "apart from the claims and not counted as reproductions.</p>")
    listed = ("<details><summary>Their chance of failing</summary><ul>" + "".join(f"<li>{c}</li>" for c in chances)
              + "</ul></details>") if chances else ""
    return "\n".join(['<div class="dalign-claims" id="dalign-checks-grid">', note,
                      _table_html(checks, claims, families, link), listed, "</div>"])
