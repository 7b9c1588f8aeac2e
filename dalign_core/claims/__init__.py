"""The paper's claims judged from every chapter's tables, and the page that shows them.

* :mod:`~dalign_core.claims.table`: one row per claim and family, with its regime beside the paper's, and each
  claim's rule; it puts together the rows of
* :mod:`~dalign_core.claims.width`: the width claims (§1, §2) and the LLaMA numbers;
* :mod:`~dalign_core.claims.certificates`: the certificates' claims (§2: coverage, tracking, the fall with the budget);
* :mod:`~dalign_core.claims.studies`: the intervention study's claims (§3) and the growth claim (ours);
* :mod:`~dalign_core.claims.rows`: what every row is made of (the row, the results it may read, the families).
* :mod:`~dalign_core.claims.page`: the claims grid of the book.

May import: :mod:`dalign_core.studies`, :mod:`dalign_core.report` and everything below them.
"""
