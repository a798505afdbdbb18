"""The documentation site builds with `mkdocs build --strict`: no broken link or anchor, no page outside the nav, no
docstring mkdocstrings cannot render (the API reference reads the source statically: nothing is imported). The
`dev` and `docs` extras install MkDocs; a missing MkDocs fails here rather than skipping. About 4 s."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.helpers.paths import MKDOCS_YML


@pytest.mark.slow
def test_mkdocs_build_strict(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(MKDOCS_YML),
                           "--site-dir", str(tmp_path / "site")], capture_output=True, text=True, timeout=240,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    assert (tmp_path / "site" / "reference" / "engine" / "index.html").is_file()
