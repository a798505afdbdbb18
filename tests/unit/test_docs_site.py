"""The documentation's shape, cheaply (no build, no subprocess): README.md stays a short front page that keeps the
two set-up commands, and mkdocs.yml's nav and docs/ list the same pages. The site itself is built with
`mkdocs build --strict` by .ci/run and by tests/docs/test_docs_build.py; its examples run in
tests/docs/test_doc_examples.py."""

from __future__ import annotations

import re

from tests.helpers.paths import DOCS, DOCUMENTS, MKDOCS_YML, README, nav_pages

SET_UP_COMMANDS = ('pip install -e . && python -m dsrecipes', 'pip install -e ".[dev]" && pytest')


def test_readme_is_a_short_front_page_with_the_two_set_up_commands():
    text = README.read_text()
    assert len(text.splitlines()) <= 250, "README.md is the front page: move detail into docs/"
    for command in SET_UP_COMMANDS:
        assert f"```bash\n{command}\n```" in text, f"README.md's Set up lost `{command}`"


def test_nav_and_docs_folder_list_the_same_pages():
    nav = nav_pages()
    assert len(nav) == len(set(nav)), "a page is in mkdocs.yml's nav twice"
    missing = [page for page in nav if not (DOCS / page).is_file()]
    assert not missing, f"mkdocs.yml's nav names pages docs/ lacks: {missing}"
    on_disk = sorted(p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md"))
    assert sorted(nav) == on_disk, f"pages outside mkdocs.yml's nav: {sorted(set(on_disk) - set(nav))}"
    assert nav[0] == "index.md"


def test_examples_are_read_from_the_readme_then_the_nav_in_order():
    assert DOCUMENTS == [README, *(DOCS / page for page in nav_pages())]


def test_readme_links_into_docs_resolve():
    text = README.read_text()
    targets = re.findall(r"\]\((docs/[^)#\s]+)(?:#[^)]*)?\)", text)
    assert targets, "README.md links into docs/"
    for target in targets:
        assert (MKDOCS_YML.parent / target).is_file(), f"README.md links to {target}, which does not exist"
