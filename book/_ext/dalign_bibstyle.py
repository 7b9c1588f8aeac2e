"""The book's bibliography style: entries labelled as the text cites them, "Zhang et al., 2026".

sphinxcontrib-bibtex cites in the text by author and year (``bibtex_reference_style:
author_year`` in ``_config.yml``), but its bibliography styles label the list itself
``[ZLY+26]`` (alpha) or ``[1]`` (plain). This registers a pybtex style, ``authoryear``
(``bibtex_default_style``), that formats entries as ``unsrt`` does, sorts them by author,
year and title, and labels each one the way the text cites it: "Cantelli, 1928",
"Efron and Stein, 1981", "Zhang et al., 2026" (a, b ... where two would read alike).
An entry without authors is labelled by its ``key`` field (else its title's first words).
"""

from __future__ import annotations

import string
from collections import Counter

from pybtex.plugin import register_plugin
from pybtex.richtext import Text
from pybtex.style.formatting.unsrt import Style as UnsrtStyle
from pybtex.style.labels import BaseLabelStyle
from pybtex.style.sorting.author_year_title import SortingStyle as AuthorYearTitleSorting


def _plain(latex: str) -> str:
    return Text.from_latex(latex).render_as("text")


def _surname(person) -> str:
    return _plain(" ".join(person.prelast_names + person.last_names))


def author_year_label(entry) -> str:
    """"Zhang et al., 2026" for one pybtex entry (no disambiguating letter)."""
    people = entry.persons.get("author") or entry.persons.get("editor") or []
    if len(people) == 1:
        who = _surname(people[0])
    elif len(people) == 2:
        who = f"{_surname(people[0])} and {_surname(people[1])}"
    elif people:
        who = f"{_surname(people[0])} et al."
    else:
        fields = entry.fields
        who = _plain(fields.get("key") or " ".join(str(fields.get("title", "Anonymous")).split()[:3]))
    return f"{who}, {entry.fields.get('year', 'n.d.')}"


class AuthorYearLabelStyle(BaseLabelStyle):
    def format_labels(self, sorted_entries):
        entries = list(sorted_entries)
        labels = [author_year_label(entry) for entry in entries]
        repeated = Counter(labels)
        seen: Counter = Counter()
        for label in labels:
            if repeated[label] > 1:
                letter = string.ascii_lowercase[seen[label] % 26]
                seen[label] += 1
                yield label + letter
            else:
                yield label


class AuthorYearStyle(UnsrtStyle):
    default_label_style = AuthorYearLabelStyle
    default_sorting_style = AuthorYearTitleSorting


def setup(app):
    register_plugin("pybtex.style.formatting", "authoryear", AuthorYearStyle)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
