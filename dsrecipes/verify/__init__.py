"""dsrecipes.verify: a recipe's layout held against one process, step by step (`python -m dsrecipes.verify ...`).

The same check the suite's layout-equivalence table (tests/integration/equivalence/) makes for its own rows, for any
recipe: the recipe trains as configured and a reference (by default the same recipe in one fp32 process, same data
order and initial weights, same global batch) trains beside it; per-step losses, gradient norms, learning rates and
loss scales and the final parameters (per tensor group) are compared within a per-precision tolerance.

    config.py     VerifyConfig (the verify.* keys) and the tolerances (the table imports them from here)
    plan.py       the two runs' overrides: forced keys, known-expected differences aligned, the reference layout, shrink
    runner.py     one training run as `python -m dsrecipes` (or torchrun) in a subprocess
    compare.py    per-step table, per-tensor-group parameter differences, the verdict (pure functions)
    report.py     verify.json, verify.md, the PNG, TensorBoard / W&B
    cli.py        the command
"""
