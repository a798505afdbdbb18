"""Curriculum pacing functions and the sequence-length batch hook (dsrecipes.data_efficiency)."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.slow
def test_importable_without_hydra():
    # every exported name loaded (the package exports lazily), so each submodule is imported, none pulling Hydra in
    code = ("import sys, dsrecipes.data_efficiency as de; [getattr(de, name) for name in de.__all__]; "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('hydra', 'omegaconf')]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
