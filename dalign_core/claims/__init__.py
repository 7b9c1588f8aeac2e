"""The paper's claims judged from every chapter's tables, and the page that shows them.

* :mod:`~dalign_core.claims.table`: one row per claim and family, with its regime beside the paper's.
* :mod:`~dalign_core.claims.page`: the claims grid of the book.

May import: :mod:`dalign_core.studies`, :mod:`dalign_core.report` and everything below them.
"""
