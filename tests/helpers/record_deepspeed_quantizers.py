"""Record DeepSpeed 0.19.6's SymQuantizer / AsymQuantizer outputs for tests/unit/test_deepspeed_parity.py.

DeepSpeed 0.19.7 removed its compression library, and the `parity` extra pins 0.19.8, so the
quantizer comparison would otherwise only run where someone installs 0.19.6 by hand. This script,
run once under DeepSpeed 0.19.6, writes what its quantizers return for every case the test checks
(tests/data/deepspeed_0_19_6_quantizers.pt); the test compares with DeepSpeed live when its
compression library is importable, and with this record otherwise.

    python -m venv --system-site-packages /tmp/ds0196
    /tmp/ds0196/bin/pip install --no-deps --no-build-isolation deepspeed==0.19.6
    /tmp/ds0196/bin/python tests/helpers/record_deepspeed_quantizers.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.unit.test_deepspeed_parity import ASYM_SHIFTS, QUANT_CASES, SYM_SHIFTS, asym_weight, sym_weight  # noqa: E402

RECORD = Path(__file__).resolve().parents[1] / "data" / "deepspeed_0_19_6_quantizers.pt"


def main() -> None:
    import deepspeed
    from deepspeed.compression.utils import AsymQuantizer, SymQuantizer

    record = {"deepspeed": deepspeed.__version__, "sym": {}, "asym": {}}
    for bits, groups in QUANT_CASES:
        for shift in SYM_SHIFTS:
            record["sym"][(bits, groups, shift)] = SymQuantizer.apply(sym_weight(bits, groups, shift), bits, None, None, groups)
        for shift in ASYM_SHIFTS:
            record["asym"][(bits, groups, shift)] = AsymQuantizer.apply(asym_weight(bits, groups, shift), bits, None, None,
                                                                        groups)
    RECORD.parent.mkdir(exist_ok=True)
    torch.save(record, RECORD)
    print(f"wrote {RECORD} from DeepSpeed {deepspeed.__version__}")


if __name__ == "__main__":
    main()
