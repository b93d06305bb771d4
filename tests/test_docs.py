"""The documentation's relative links resolve: every file and heading a README, CHANGELOG or docs/ page links to exists."""

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_every_relative_link_of_the_docs_resolves():
    spec = importlib.util.spec_from_file_location("check_links", REPO / "docs" / "check_links.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    checked, broken = module.broken_links(REPO)
    assert checked > 50 and broken == [], broken
