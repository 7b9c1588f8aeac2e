"""The experiments behind the book's chapters: one module each, a config dataclass with its profiles, a ``run``
function and a ``python -m dalign_repro.experiments.<name>`` entry point (shared by :mod:`._runner`).

May import anything below it: sweep, studies, report, claims and the rest.
"""
