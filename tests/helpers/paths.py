"""Where things are, for tests at any depth of the tree (tests/unit, tests/integration, tests/docs ...)."""

from pathlib import Path

import yaml

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent
TEST_DATA = TESTS / "data"
HELPERS = TESTS / "helpers"
README = REPO / "README.md"
DOCS = REPO / "docs"
MKDOCS_YML = REPO / "mkdocs.yml"


def nav_pages(nav=None) -> list[str]:
    """The pages mkdocs.yml's nav lists (paths relative to docs/), in nav order."""
    if nav is None:
        nav = yaml.safe_load(MKDOCS_YML.read_text())["nav"]
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, dict):
        return [page for value in nav.values() for page in nav_pages(value)]
    return [page for entry in nav for page in nav_pages(entry)]


# The documents whose examples run (tests/docs/test_doc_examples.py), in the order they run: README.md, then the
# site's pages in nav order, so an example may use what one on an earlier page (or earlier on its page) produced.
DOCUMENTS = [README, *(DOCS / page for page in nav_pages())]
