"""Results on disk and what the book says of them.

* :mod:`~dalign_repro.report.results`: the results contract (tidy CSV + provenance JSON, skipped by config hash).
* :mod:`~dalign_repro.report.describe`: the sentences the width chapters print, computed from the tables (a folder:
  the runs, the verdicts, the measured geometry, the rerun box, a plain-text summary).
* :mod:`~dalign_repro.report.figure_style`: the figure style every chapter shares (sizes, fonts, ticks, colours, legends).
* :mod:`~dalign_repro.report.plots`: the width and theory chapters' figures.
* :mod:`~dalign_repro.report.timings`: measured rerun costs, one table for the book and the README.

May import: :mod:`dalign_repro.sweep` and everything below it.
"""
