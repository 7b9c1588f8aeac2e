"""The interventions chapter's headline figure: one panel per question, stacked, a row per family or group."""

from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from dalign_repro.studies.interventions import plots as iplots  # noqa: E402


def _verdicts():
    row = dict(from_g=1.02, from_g_lo=0.8, from_g_hi=1.3, same_sample=0.99)
    return {"llama": {"label": "inconclusive", "row": row},
            "resnet": {"label": "contradicted", "row": {**row, "from_g": 0.01, "from_g_lo": -0.08, "from_g_hi": 0.06}},
            "pythia": {"label": "not run", "reason": "no step measured on E"}}


def _prediction():
    return pd.DataFrame([dict(family="llama", setting="train/heldout", p_pos=0.85, p_pos_lo=0.7, p_pos_hi=0.93,
                              p_nonpos=0.65, p_nonpos_lo=0.45, p_nonpos_hi=0.83),
                         dict(family="resnet", setting="heldout/heldout", p_pos=0.6, p_pos_lo=0.4, p_pos_hi=0.8,
                              p_nonpos=math.nan, p_nonpos_lo=math.nan, p_nonpos_hi=math.nan)])


def test_the_headline_has_a_row_per_judged_family_and_per_group():
    fig = iplots.headline(_verdicts(), _prediction())
    top, bottom = fig.axes[:2]
    assert [t.get_text() for t in top.get_yticklabels()] == ["LLaMA", "ResNet-20"]  # "not run" has no row
    assert [t.get_text() for t in bottom.get_yticklabels()] == ["LLaMA,\ntrain/held-out", "ResNet-20,\nheld-out/held-out"]
    assert top.get_xlim() == (-0.5, 1.5)
    plt.close(fig)


def test_the_headline_says_when_there_is_nothing_to_draw():
    fig = iplots.headline({}, pd.DataFrame())
    texts = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert "no step measured on E" in texts and "no sign draw" in texts
    plt.close(fig)
