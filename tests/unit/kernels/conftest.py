"""Kernel tests: Triton on CPU through its interpreter, inside these tests only.

Triton picks the interpreter when a kernel is *decorated*, i.e. when a dsrecipes.kernels module is first
imported, so these tests run in a private copy of dsrecipes imported under TRITON_INTERPRET=1
(tests/helpers/triton_interpreter.py): each test module here is imported inside it, and each test's setup,
call and teardown run inside it. The rest of the suite, in the same test process, keeps its own modules with
their torch paths and never sees the variable (tests/conftest.py checks). Under the interpreter only fp32 runs
(numpy has no bfloat16); the bf16 checks are the `gpu`-marked tests, skipped without CUDA by tests/conftest.py.
With a CUDA device nothing is swapped: the kernels compile as usual.

Also: the `tolerance` fixture, which reads (rtol, atol) per (op, dtype) from TOLERANCES.md so the
table there is the one source of the numbers the tests use.
"""

from __future__ import annotations

import re
from contextlib import nullcontext
from pathlib import Path

import pytest
import torch

from tests.helpers.triton_interpreter import InterpretedModules, needs_interpreter

_INTERPRETED = InterpretedModules() if needs_interpreter() else None


def interpreted():
    """The context every kernel test (and its module's import) runs in."""
    return _INTERPRETED.active() if _INTERPRETED is not None else nullcontext()


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector):
    # a test module's imports (from dsrecipes.kernels.x import y) bind the interpreted copy
    if isinstance(collector, pytest.Module):
        with interpreted():
            return (yield)
    return (yield)


def pytest_unconfigure(config):
    """The copy's modules are torn down with the process's own at exit (else nanobind reports the triton objects
    they hold as leaks)."""
    if _INTERPRETED is not None:
        _INTERPRETED.release()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    with interpreted():
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    with interpreted():
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    with interpreted():
        return (yield)


_NUMBER = re.compile(r"[0-9]+(\.[0-9]*)?([eE][+-]?[0-9]+)?")
_TOLERANCES_MD = Path(__file__).with_name("TOLERANCES.md")


def _read_tolerances() -> dict[tuple[str, str], tuple[float, float]]:
    """{(op, dtype): (rtol, atol)} from the markdown table rows `| op | dtype | rtol | atol | why |`."""
    table = {}
    for line in _TOLERANCES_MD.read_text().splitlines():
        cells = [c.strip().strip("`") for c in line.strip().strip("|").split("|")]
        if len(cells) < 4 or not all(_NUMBER.fullmatch(c) for c in cells[2:4]):
            continue  # header, separator, prose
        table[(cells[0], cells[1])] = (float(cells[2]), float(cells[3]))
    return table


@pytest.fixture(scope="session")
def tolerance():
    """tolerance(op, dtype) -> dict(rtol=..., atol=...) for torch.testing.assert_close, from TOLERANCES.md."""
    table = _read_tolerances()

    def lookup(op: str, dtype: torch.dtype) -> dict[str, float]:
        key = (op, str(dtype).replace("torch.", ""))
        if key not in table:
            raise KeyError(f"no row for {key} in {_TOLERANCES_MD}")
        rtol, atol = table[key]
        return {"rtol": rtol, "atol": atol}

    return lookup


@pytest.fixture
def fresh_fallback_warnings(monkeypatch):
    """Forget which ops already warned about falling back, so a test can see the one-time warning."""
    from dsrecipes.kernels import _utils

    monkeypatch.setattr(_utils, "_WARNED", set())


def _leaf(t, dtype=None):
    """A fresh leaf copy of a floating tensor (cast to dtype if given) that requires grad; others as is."""
    if isinstance(t, torch.Tensor) and t.is_floating_point():
        return t.detach().to(dtype or t.dtype).clone().requires_grad_(True)
    return t


def _check_against_reference(fn, ref_fn, args, tol, *, ref_dtype=None, grad_outputs=None, expect_fn=None,
                             grad_tol=None):
    """Run fn and ref_fn on separate leaf copies of `args`; compare every output and every input grad.

    fn / ref_fn take the positional `args` (None entries pass through). With `ref_dtype`, the
    reference runs on copies cast to it (the bf16 GPU tier: fp32 reference) and results are compared
    in that dtype. `grad_outputs(outs)` picks the upstream gradients (default: randn per output; None
    entries leave an output unused). `expect_fn` asserts fn took the Triton path: the name of the
    autograd.Function whose backward node the first output must carry. `grad_tol` (default `tol`)
    for the input gradients. Returns (outputs, ref_outputs).
    """
    mine = [_leaf(t) for t in args]
    theirs = [_leaf(t, ref_dtype) for t in args]
    out = fn(*mine)
    ref = ref_fn(*theirs)
    outs = out if isinstance(out, tuple) else (out,)
    refs = ref if isinstance(ref, tuple) else (ref,)
    assert len(outs) == len(refs)
    if expect_fn is not None:
        assert type(outs[0].grad_fn).__name__ == f"{expect_fn}Backward", (
            f"expected the Triton path ({expect_fn}), got grad_fn {type(outs[0].grad_fn).__name__}")
    gen = torch.Generator(device="cpu").manual_seed(1234)
    if grad_outputs is None:
        gs = [torch.randn(o.shape, generator=gen).to(o.device, o.dtype) for o in outs]
    else:
        gs = grad_outputs(outs)
    cmp_dtype = ref_dtype or None
    for i, (o, r) in enumerate(zip(outs, refs)):
        torch.testing.assert_close(o.to(cmp_dtype or o.dtype), r.to(cmp_dtype or o.dtype), **tol,
                                   msg=lambda m, i=i: f"output {i}: {m}")
    used = [(o, g) for o, g in zip(outs, gs) if g is not None]
    used_ref = [(r, g) for r, g in zip(refs, gs) if g is not None]
    torch.autograd.backward([o for o, _ in used], [g for _, g in used])
    torch.autograd.backward([r for r, _ in used_ref], [g.to(r.dtype) for r, g in used_ref])
    for i, (a, b) in enumerate(zip(mine, theirs)):
        if isinstance(a, torch.Tensor) and a.requires_grad:
            # An input the used outputs do not depend on: autograd leaves None, a kernel may give 0.
            ga = a.grad if a.grad is not None else torch.zeros_like(a)
            gb = b.grad if b.grad is not None else torch.zeros_like(b)
            torch.testing.assert_close(ga.to(cmp_dtype or ga.dtype), gb.to(cmp_dtype or ga.dtype),
                                       **(grad_tol or tol), msg=lambda m, i=i: f"grad of arg {i}: {m}")
    return outs, refs


@pytest.fixture(scope="session")
def check_against_reference():
    """The `_check_against_reference(fn, ref_fn, args, tol, ...)` helper, as a fixture."""
    return _check_against_reference
