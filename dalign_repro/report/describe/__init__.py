"""Sentences a chapter prints about a width sweep, generated from its results tables.

Every sentence that describes our runs, or compares our numbers with the paper's,
comes from here: the chapter never types a number or a verdict. The inputs are the
tables :mod:`dalign_repro.sweep.run` writes (``<family>_runs``, ``_lr``, ``_trend``,
``_misalignment``), read back with :func:`dalign_repro.report.results.read_table`.

* :mod:`~dalign_repro.report.describe.text`: how a number, a missing value and a table are written.
* :mod:`~dalign_repro.report.describe.runs`: the runs (which trained, the loss by width) and the learning rates.
* :mod:`~dalign_repro.report.describe.verdicts`: the width claims' verdicts, the paper's regime and reference, the
  training clock behind matched loss, and the verdict and paper tables.
* :mod:`~dalign_repro.report.describe.geometry`: what was measured (d_align along training, d_∥ against d_2, layers,
  bounds, budgets, sample unit and context, redundancy).
* :mod:`~dalign_repro.report.describe.rerun`: the "Rerun this chapter" box (the command and what it costs).
* :mod:`~dalign_repro.report.describe.summary`: a plain-text summary of a results folder
  (``python -m dalign_repro.report.describe results/gpu``).

Every public name of these modules is importable from here (the chapters read
``from dalign_repro.report import describe as report``).
"""

from __future__ import annotations

from dalign_repro.report.describe.text import (DASH, D_ALIGN_HTML, number, styled, trained_rows)
from dalign_repro.report.describe.runs import (by_regime, sweep_records, judged_only, describe_accuracy, describe_runs,
                                              RATE_TIE, trials, describe_learning_rates, describe_rate_resolution,
                                              runs_summary)
from dalign_repro.report.describe.verdicts import (WIDTH_CLAIMS, PAPER_REGIMES, SCALE, at_this_scale, scale_for,
                                                  family_reference, reference_text, judged_rows, judged_geometry,
                                                  late_steps, width_verdicts, describe_clock, describe_power,
                                                  paper_comparison, verdict_table, misalignment_cells,
                                                  misalignment_reference_text, robustness_sentence, models_regime,
                                                  papers_regime_beside)
from dalign_repro.report.describe.geometry import (describe_trajectory, describe_limiting_dimension, describe_layers,
                                                  describe_final_geometry, describe_bounds, describe_budget,
                                                  describe_context, describe_sample_choice, describe_redundancy)
from dalign_repro.report.describe.rerun import (rerun_box, results_took)
from dalign_repro.report.describe.summary import (REGIME_COLUMNS, summarize)

__all__ = ["DASH", "D_ALIGN_HTML", "number", "styled", "trained_rows", "by_regime", "sweep_records", "judged_only",
           "describe_accuracy", "describe_runs", "RATE_TIE", "trials", "describe_learning_rates",
           "describe_rate_resolution", "runs_summary", "WIDTH_CLAIMS", "PAPER_REGIMES", "SCALE", "at_this_scale",
           "scale_for", "family_reference", "reference_text", "judged_rows", "judged_geometry", "late_steps",
           "width_verdicts", "describe_clock", "describe_power", "paper_comparison", "verdict_table",
           "misalignment_cells", "misalignment_reference_text", "robustness_sentence", "models_regime",
           "papers_regime_beside",
           "describe_trajectory", "describe_limiting_dimension", "describe_layers", "describe_final_geometry",
           "describe_bounds", "describe_budget", "describe_context", "describe_sample_choice", "describe_redundancy",
           "rerun_box", "results_took", "REGIME_COLUMNS", "summarize"]
