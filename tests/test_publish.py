"""The book's repository address: only an address its theme can link to, never a local folder or credentials."""

import sys

import pytest

from dalign_repro.config import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "book" / "_ext"))
import dalign_publish  # noqa: E402


@pytest.mark.parametrize("given, expected", [
    ("git@github.com:owner/name.git", "https://github.com/owner/name"),
    ("https://user:token@gitlab.com/owner/name.git", "https://gitlab.com/owner/name"),
    ("/work/main/.", ""),  # a fresh clone's origin: a local folder, no page to link to (it stopped the build)
    ("file:///srv/dalign.git", ""),
    ("https://example.org/owner/name", ""),  # a host the theme does not know would stop the build
    ("", ""),
])
def test_the_repository_address_is_one_the_theme_can_link_to(given, expected, monkeypatch):
    monkeypatch.delenv("DALIGN_REPOSITORY_URL", raising=False)
    assert dalign_publish.repository_url(given) == expected
