"""The claims chapter at a glance: a grid of claim × family with coloured verdicts, and a headline.

:func:`claims_grid_html` turns a claims table (:func:`dalign_core.claims.claims_table`) into
one self-contained HTML block: a row per claim, a column per family (LLaMA, Pythia,
ResNet-20), each cell one coloured label per scope (a depth regime or a data set), linked
to the chapter whose figures show the evidence. Rows with nothing judged at the profile
fold away into a ``<details>`` toggle. The table fits a 700-px column and, below 600 px
(a phone's 390), each row becomes a card with its family labels side by side.
:func:`headline` counts the verdicts of the paper's width claims, the theorem checks and
the intervention claims separately.

Nothing here judges anything: the labels are the table's.
"""

from __future__ import annotations

import html
import math
from collections import Counter

import pandas as pd

from dalign_core import growth
from dalign_core.claims import NOT_RUN

__all__ = ["FAMILIES", "GROUPS", "VERDICTS", "claim_group", "claims_grid_html", "headline", "headline_text",
           "verdict_class"]

GROUPS = {
    "width": ("the paper's width claims", (
        "d_align rises with width (matched steps)", "d_align rises with width (matched loss)",
        "misalignment falls with width at fixed (M, K)", "d_align from N = 512 to 3072")),
    "theorem": ("the theorem checks", (
        "empirical ≤ B_exact ≤ B_align", "certificates track the empirical rate", "misalignment falls with M and K")),
    "intervention": ("the intervention claims", (
        "positive alignment predicts a decrease", "retention at small steps")),
    "growth": ("the growth claim (ours, beyond the paper)", (growth.CLAIM,)),
}
"""Group key -> (its name in the headline, its claims in the paper's order)."""

FAMILIES = ("LLaMA", "Pythia", "ResNet-20")
"""The grid's columns: a scope's family is its name before the comma ("Pythia, 6 layers" -> Pythia)."""

VERDICTS = ("reproduced", "partly", "inconclusive", "contradicted", "not reproduced", NOT_RUN)
"""Every label, in the order the headline lists them."""

CHAPTER_NAMES = {"01_theory": "theory", "02_llama_width": "LLaMA", "03_pythia_width": "Pythia",
                 "04_resnet_width": "ResNet-20", "05_interventions": "interventions", "08_growth": "growth"}

_SYMBOLS = (("d_align", "d<sub>align</sub>"), ("B_exact", "B<sub>exact</sub>"), ("B_align", "B<sub>align</sub>"),
            ("(M, K)", "(<i>M</i>, <i>K</i>)"), (" N = ", " <i>N</i> = "))

_STYLE = """
<style>
.dalign-claims { max-width: 100%; margin: 0.5rem 0 1rem; font-size: 0.95rem; }
.dalign-claims table { width: 100%; table-layout: fixed; border-collapse: collapse; margin: 0; }
.dalign-claims th, .dalign-claims td { padding: 0.35rem 0.4rem; vertical-align: top; text-align: left;
  border-bottom: 1px solid rgba(128, 128, 128, 0.35); overflow-wrap: anywhere; word-break: normal; }
.dalign-claims thead th { font-weight: 600; border-bottom: 2px solid rgba(128, 128, 128, 0.6); }
.dalign-claims col.claim { width: 37%; }
.dalign-claims th.group { padding-top: 0.8rem; font-size: 0.85rem; text-transform: uppercase; letter-spacing: 0.03em;
  opacity: 0.75; border-bottom: none; }
.dalign-claims .verdict { display: inline-block; margin: 0 0.25rem 0.25rem 0; padding: 0.05rem 0.45rem;
  border-radius: 0.8rem; font-size: 0.8rem; line-height: 1.4; font-weight: 600; white-space: normal;
  text-decoration: none; border: 1px solid transparent; }
.dalign-claims a.verdict:hover { text-decoration: underline; }
.dalign-claims .regime { display: block; font-size: 0.75rem; opacity: 0.8; }
.dalign-claims .slope { display: block; font-size: 0.72rem; opacity: 0.8; margin: -0.15rem 0 0.3rem; }
.dalign-claims .v-reproduced { background: #d6f0dc; color: #14532d; border-color: #86c79a; }
.dalign-claims .v-partly { background: #fdf0c8; color: #6b4e00; border-color: #e3c35e; }
.dalign-claims .v-inconclusive { background: #e4e8ef; color: #27344a; border-color: #a8b3c4; }
.dalign-claims .v-contradicted { background: #f9d5d3; color: #7f1d1d; border-color: #e08e88; }
.dalign-claims .v-not-reproduced { background: #fbe0cc; color: #7c2d12; border-color: #e9a676; }
.dalign-claims .v-not-run { background: transparent; color: inherit; opacity: 0.65; border: 1px dashed #999; }
html[data-theme="dark"] .dalign-claims .v-reproduced { background: #163d24; color: #b9efc8; border-color: #2f7a48; }
html[data-theme="dark"] .dalign-claims .v-partly { background: #3f3410; color: #f6dd8a; border-color: #8a6f1d; }
html[data-theme="dark"] .dalign-claims .v-inconclusive { background: #27303f; color: #d3dbe8; border-color: #56627a; }
html[data-theme="dark"] .dalign-claims .v-contradicted { background: #4a1b1b; color: #f8c4c0; border-color: #9a3b35; }
html[data-theme="dark"] .dalign-claims .v-not-reproduced { background: #47260f; color: #f7c9a6; border-color: #a0592a; }
.dalign-claims details { margin-top: 0.75rem; }
.dalign-claims summary { cursor: pointer; font-weight: 600; }
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


def _label(row, link: bool) -> str:
    verdict = str(row.verdict)
    shown = "not run" if verdict == NOT_RUN else verdict
    chapter = str(row.chapter) if isinstance(row.chapter, str) else ""
    title = html.escape(f"{row.claim} ({row.scope}): ours: {row.ours}; the paper: {row.paper}", quote=True)
    css = f"verdict {verdict_class(verdict)}"
    if link and chapter:
        label = (f'<a class="{css}" href="{html.escape(chapter)}.html" title="{title}">{html.escape(shown)}'
                 f'<span class="visually-hidden"> ({html.escape(CHAPTER_NAMES.get(chapter, chapter))} '
                 f'chapter)</span></a>')
    else:
        label = f'<span class="{css}" title="{title}">{html.escape(shown)}</span>'
    regime = _regime(row.scope)
    slope = ""
    value = getattr(row, "slope", math.nan)
    if verdict != NOT_RUN and isinstance(value, (int, float)) and not math.isnan(value):
        lo, hi = getattr(row, "slope_lo", math.nan), getattr(row, "slope_hi", math.nan)
        slope = f'<span class="slope">slope {value:+.2f} [{lo:+.2f}, {hi:+.2f}]</span>'
    return (f'<span class="regime">{html.escape(regime)}</span>' if regime else "") + label + slope


def _rows_html(table: pd.DataFrame, claims: list[str], families: list[str], link: bool) -> str:
    out = []
    for group in list(GROUPS) + ["other"]:
        in_group = [claim for claim in claims if claim_group(claim) == group]
        if not in_group:
            continue
        name = GROUPS[group][0] if group in GROUPS else "other claims"
        out.append(f'<tr><th class="group" colspan="{1 + len(families)}">{html.escape(name[0].upper() + name[1:])}'
                   "</th></tr>")
        for claim in in_group:
            rows = table[table.claim == claim]
            cells = []
            for family in families:
                part = rows[rows.scope.map(_family) == family]
                inner = "".join(_label(row, link) for row in part.itertuples(index=False))
                cells.append(f'<td class="family" data-family="{html.escape(family)}">{inner}</td>')
            out.append(f'<tr><th scope="row" class="claim">{_claim_html(claim)}</th>{"".join(cells)}</tr>')
    return "\n".join(out)


def _table_html(table: pd.DataFrame, claims: list[str], families: list[str], link: bool) -> str:
    head = "".join(f'<th scope="col">{html.escape(f)}</th>' for f in families)
    cols = '<col class="claim">' + "<col>" * len(families)
    return (f"<table><colgroup>{cols}</colgroup><thead><tr><th scope=\"col\">Claim</th>{head}</tr></thead>"
            f"<tbody>\n{_rows_html(table, claims, families, link)}\n</tbody></table>")


def claims_grid_html(table: pd.DataFrame, link: bool = True) -> str:
    """The grid of claim × family as one HTML block (its own ``<style>``); see the module docstring.

    ``link``: each label links to its chapter (``<chapter>.html``, beside this page in the book).
    Claims with no verdict at all but "not run" are listed under a ``<details>`` toggle, closed.
    """
    if table.empty:
        return '<div class="dalign-claims"><p>No claim was judged.</p></div>'
    present = [f for f in FAMILIES if (table.scope.map(_family) == f).any()]
    families = present + [f for f in dict.fromkeys(table.scope.map(_family)) if f not in present]
    claims = list(dict.fromkeys(table.claim))
    judged = [c for c in claims if (table[table.claim == c].verdict != NOT_RUN).any()]
    idle = [c for c in claims if c not in judged]
    parts = [_STYLE, '<div class="dalign-claims">']
    if judged:
        parts.append(_table_html(table, judged, families, link))
    if idle:
        parts.append(f"<details><summary>{len(idle)} claim{'s' if len(idle) > 1 else ''} not run at this profile"
                     "</summary>")
        parts.append(_table_html(table, idle, families, link))
        parts.append("</details>")
    parts.append("</div>")
    return "\n".join(parts)


def headline(table: pd.DataFrame) -> dict[str, Counter]:
    """``{group: Counter(verdict -> rows)}`` for width, theorem, intervention and growth claims (rows: claim × scope)."""
    counts = {group: Counter() for group in GROUPS}
    for row in table.itertuples(index=False):
        counts.setdefault(claim_group(row.claim), Counter())[row.verdict] += 1
    return counts


def headline_text(table: pd.DataFrame, profile: str) -> str:
    """One Markdown sentence per group: "The paper's width claims (12 checks): 1 reproduced, 9 inconclusive ..."."""
    lines = []
    for group, counter in headline(table).items():
        total = sum(counter.values())
        if not total:
            continue
        name = GROUPS[group][0] if group in GROUPS else "other claims"
        judged = [f"{counter[v]} {v}" for v in VERDICTS if v != NOT_RUN and counter[v]]
        judged += [f"{counter[v]} {v}" for v in counter if v not in VERDICTS]
        idle = counter[NOT_RUN]
        text = ", ".join(judged) if judged else "none judged"
        if idle:
            text += f"; {idle} not run at `{profile}`"
        lines.append(f"- **{name[0].upper() + name[1:]}** ({total} claim × scope "
                     f"check{'s' if total > 1 else ''}): {text}.")
    return "\n".join(lines)
