"""Where things are, for tests at any depth of the tree (tests/unit, tests/integration, tests/docs ...)."""

from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent
TEST_DATA = TESTS / "data"
HELPERS = TESTS / "helpers"
README = REPO / "README.md"
