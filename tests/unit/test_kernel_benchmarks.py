"""CPU smoke of the kernel benchmark script: every case runs at tiny sizes (reference vs eager) and the
CSV / JSON / markdown outputs have the expected rows. The GPU measurements themselves are not tested."""

from __future__ import annotations

import pytest
import torch

from dsrecipes.benchmarks import kernels as kb

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU smoke: on a GPU main() runs real benchmarks")


def test_cpu_without_quick_only_says_a_gpu_is_needed(tmp_path, capsys):
    assert kb.main(["--out", str(tmp_path)]) == []
    assert kb.GPU_NEEDED in capsys.readouterr().out
    assert not (tmp_path / "kernels.csv").exists()
