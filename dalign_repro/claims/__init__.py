"""The paper's claims judged from every chapter's tables, and the page that shows them.

* :mod:`~dalign_repro.claims.table`: one row per claim and family, with its regime beside the paper's, and each
  claim's rule; it puts together the rows of
* :mod:`~dalign_repro.claims.width`: the width claims (§1, §2) and the LLaMA numbers;
* :mod:`~dalign_repro.claims.certificates`: the certificates' claims (§2: coverage, tracking, the fall with the budget);
* :mod:`~dalign_repro.claims.studies`: the intervention study's claims (§3) and the growth claim (ours);
* :mod:`~dalign_repro.claims.rows`: what every row is made of (the row, the results it may read, the families).
* :mod:`~dalign_repro.claims.page`: the claims grid of the book;
* :mod:`~dalign_repro.claims.chapter`: what a chapter shows of its own rows (matched loss decomposed, the checks of
  the computation with their chance of failing, each context's rows), from the same code.

May import: :mod:`dalign_repro.studies`, :mod:`dalign_repro.report` and everything below them.
"""
