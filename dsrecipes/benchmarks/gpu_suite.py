"""Every GPU figure the project states, in one run of at most 8 minutes on one H100 / H200.

    python -m dsrecipes.benchmarks.gpu_suite --out bench/                     # the full suite, on a GPU
    python -m dsrecipes.benchmarks.gpu_suite --out bench/ --write-policy      # + install the measured kernel policy
    python -m dsrecipes.benchmarks.gpu_suite --out bench/ --skip tests inference
    python -m dsrecipes.benchmarks.gpu_suite --smoke --out /tmp/suite         # tiny, runs on CPU (a code-path check)

Sections (each timed against its budget, each skippable with --skip SECTION), composed from the benchmark
modules beside this one:

  kernels    dsrecipes.benchmarks.kernels: GB/s or TFLOP/s of every dsrecipes.kernels Triton op against torch
             eager and torch.compile, at the module's LLM shapes (bf16; attention B=2 H=16 T=4096 D=128
             causal), triton.testing.do_bench medians. Budget 140 s; ops not started by then are listed.
             From this table a fresh kernels.backend=auto policy is derived (triton where the Triton op is at
             least as fast as both torch eager and torch.compile): <out>/gpu_suite_kernel_policy.json;
             --write-policy copies it over the packaged dsrecipes/models/kernel_policy.json (GPU runs only).
  train      dsrecipes.benchmarks.train_throughput's variant runner: GPT-2 124M (vocab 50304) on the built-in
             corpus (data.max_bytes 8 MB), 16 x 1024 tokens per step, 30 steps, log interval 5 (median of the
             windows after the first, so compilation is excluded); variants eager (precision=bf16), compile
             (+ compile=blocks), compile+fp8 (+ compile=blocks fp8=tensorwise), kernels auto (+ kernels=auto).
             A variant whose overrides do not compose (a config group this checkout lacks) is a failed row
             with the error. Budget 170 s; variants not started by then are skipped rows.
  inference  dsrecipes.benchmarks.inference: a 1.3B model (gpt_1_3b, vocab 50304, random weights) at batch 1,
             prompt 64, 64 new tokens, median of 3 repeats, implementations engine (bf16), graph (bf16 + CUDA
             graphs), int8, int8_graph; the fraction of the HBM roofline uses --hbm-gbps (default by device
             name: H100 SXM 3350, H200 4800 GB/s). Budget 80 s.
  tests      the GPU test tier, `pytest -m gpu -n 4` as a subprocess (needs the source checkout's tests/):
             passed / failed / skipped / error counts from its JUnit XML. Budget (its timeout) 70 s.

The budgets sum to 460 s, leaving ~20 s for start-up and writing; they are estimates, not yet measured on a
GPU. The suite section records each section's wall time against its budget and the total against 480 s.

Outputs in --out: gpu_suite.csv (one row per figure: section, name, value, unit, target, met, note),
gpu_suite.md (the hardware line - GPU, torch, CUDA, Triton - then the targets and one table per section,
ready to paste into docs/benchmarks.md), gpu_suite_kernel_policy.json, and each section's own outputs in kernels/,
train/, inference/, tests/. The issue's targets get target and met: GPT-2 124M >= 50% MFU in bf16 with
compile; flash attention forward >= 0.9x SDPA at T=4096 D=128; norms >= 80% of HBM bandwidth; batch-1 decode of
a 1.3B model >= 70% of the bandwidth roofline (and int8 decode >= 1.6x bf16).

--smoke: tiny shapes so it runs on CPU in about a minute: the kernel benchmark's --quick CPU path (reference vs
eager, no Triton) on layer_norm, rms_norm, flash_attention and cross_entropy; gpt_debug at 2 x 32 tokens for 4
steps, fp32 on CPU instead of bf16 (bf16 autocast on CPU is only slow), compile variants skipped on CPU (a line
says so); gpt_tiny decode (graph rows skipped on CPU); and, instead of running the GPU tier (which would
recurse into the test suite), `pytest --collect-only -m gpu tests/unit/test_gpu.py`. Smoke figures never claim a
target (met = "n/a (smoke)").
"""

from __future__ import annotations

import argparse
import datetime
import re
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

import torch

from dsrecipes.benchmarks import gpu_suite_report as rep
from dsrecipes.benchmarks.gpu_suite_report import Figure
from dsrecipes.models.kernel_policy import POLICY_FILE, policy_from_kernel_rows, policy_json

SECTIONS = ("kernels", "train", "inference", "tests")
BUDGET_S = {"kernels": 140.0, "train": 170.0, "inference": 80.0, "tests": 70.0}
TOTAL_BUDGET_S = 480.0
VARIANTS = ("precision=bf16", "precision=bf16 compile=blocks", "precision=bf16 compile=blocks fp8=tensorwise",
            "precision=bf16 kernels=auto")
SMOKE_KERNEL_OPS = ("layer_norm", "rms_norm", "flash_attention", "cross_entropy")
DECODE_IMPLS = ("engine", "graph", "int8", "int8_graph")
POLICY_NAME = "gpu_suite_kernel_policy.json"


@dataclass
class Plan:
    """What each section runs: the full suite's shapes, or the smoke's."""

    smoke: bool
    cuda: bool

    @property
    def train_model(self) -> tuple[str, int, int, int, int, list[str]]:  # model, seq, micro-batch, steps, log, extra
        if self.smoke:
            return "gpt_debug", 32, 2, 4, 1, ["data.max_bytes=100000"]
        return "gpt2_124m", 1024, 16, 30, 5, ["model.vocab_size=50304", "data.max_bytes=8000000"]

    @property
    def decode(self) -> tuple[str, int, int, int, int]:  # model, vocab, prompt, new tokens, repeats
        return ("gpt_tiny", 320, 16, 8, 1) if self.smoke else ("gpt_1_3b", 50304, 64, 64, 3)


def _tests_dir() -> Path | None:
    import dsrecipes

    tests = Path(dsrecipes.__file__).resolve().parents[1] / "tests"
    return tests if (tests / "conftest.py").is_file() else None


# --------------------------------------------------------------------------------------------------
# Sections: each returns (figures, extra markdown or None) and writes its own outputs under out/<section>
# --------------------------------------------------------------------------------------------------


def section_kernels(plan: Plan, out: Path, deadline: float, hbm_gbps: float | None, write_policy: bool,
                    suite_out: Path) -> tuple[list[Figure], str]:
    from dsrecipes.benchmarks import kernels as kb

    if not plan.cuda:
        print(kb.GPU_NEEDED + " Running the kernel benchmark's --quick CPU smoke (reference vs eager).")
    c = kb.Ctx(torch.device("cuda" if plan.cuda else "cpu"), torch.bfloat16 if plan.cuda else torch.float32, plan.smoke)
    ops = list(SMOKE_KERNEL_OPS if plan.smoke else kb.CASES)
    torch.manual_seed(0)
    rows, not_started = kb.run_ops(ops, c, use_compile=plan.cuda, deadline=deadline)
    meta = kb.run_meta(c, "bf16" if plan.cuda else "fp32")
    kb.print_table(rows, meta)
    kb.write_outputs(rows, meta, out)
    figs = rep.kernel_figures(rows, hbm_gbps, plan.smoke)
    figs += [Figure("kernels", f"{op}", None, note="skipped: the section's time budget was spent") for op in not_started]
    md = rep.kernel_markdown(rows)
    md += "\n" + _write_policy(rows, meta, suite_out, write_policy and plan.cuda and not plan.smoke)
    if write_policy and not (plan.cuda and not plan.smoke):
        print("--write-policy: not installed (only a full GPU run measures the Triton ops)")
    return figs, md


def _write_policy(rows: list[dict], meta: dict, out: Path, install: bool) -> str:
    """<out>/gpu_suite_kernel_policy.json from the kernel rows (and, with install, the packaged file);
    returns its markdown table."""
    source = (f"gpu_suite kernel table (torch {meta['torch']}, Triton {meta['triton']}, {meta['dtype']}"
              f"{', smoke' if meta['quick'] else ''})")
    policy = policy_from_kernel_rows(rows, meta["device_name"], datetime.date.today().isoformat(), source)
    path = out / POLICY_NAME
    path.write_text(policy_json(policy, "kernels.backend=auto per-op policy measured by dsrecipes.benchmarks.gpu_suite"))
    print(f"wrote {path}; install it with --write-policy (or: cp {path} {POLICY_FILE})")
    if install:
        shutil.copyfile(path, POLICY_FILE)
        print(f"--write-policy: installed {POLICY_FILE}")
    body = [[op, p.backend, p.ratio, p.pass_, p.source] for op, p in policy.items()]
    return "kernels.backend=auto policy derived from this table (ratio = faster torch baseline ms / Triton ms):\n\n" + \
        rep.markdown_table(["op", "auto", "ratio", "pass", "source"], body)


def section_train(plan: Plan, out: Path, deadline: float, train_extra: list[str]) -> tuple[list[Figure], None]:
    from dsrecipes.benchmarks.results import BarChart, write_rows
    from dsrecipes.benchmarks.train_throughput import base_overrides, run_variants

    model, seq, micro_batch, steps, log_interval, extra = plan.train_model
    extra = extra + list(train_extra)
    variants, skipped = [], []
    for v in VARIANTS:
        if not plan.cuda and ("compile=" in v or "fp8=" in v):
            skipped.append(v)
            continue
        variants.append(v.replace("precision=bf16", "precision=fp32") if not plan.cuda else v)
    if not plan.cuda and variants:
        print("train: on CPU the variants run fp32 instead of bf16 (bf16 autocast on CPU is only slower)")
    base = base_overrides(model, seq, micro_batch, steps, log_interval, extra)
    out.mkdir(parents=True, exist_ok=True)
    rows = run_variants(base, variants, out, deadline=deadline)
    rows += [{"variant": v, "status": "skipped", "error": "not run on CPU (torch.compile and fp8 are measured on a GPU)"}
             for v in skipped]
    for r in rows:
        if r["status"] != "ok":
            print(f"train: {r['variant']}: {r['status']}: {r['error']}")
    write_rows(out, "throughput", rows, None, BarChart(f"training throughput: {model}", "tokens/s",
                                                      {"tokens_per_s": ""}, labels=("variant",)))
    return rep.train_figures(rows, plan.smoke), None


def section_inference(plan: Plan, out: Path, deadline: float, hbm_gbps: float | None) -> tuple[list[Figure], None]:
    from dsrecipes.benchmarks import inference as inf
    from dsrecipes.benchmarks.results import write_rows

    name, vocab, prompt, new_tokens, repeats = plan.decode
    device = "cuda" if plan.cuda else "cpu"
    dtype = torch.bfloat16 if plan.cuda else torch.float32
    model = inf.model_from_name(name, vocab, None)
    rows, skipped = [], {}
    for impl in DECODE_IMPLS:
        if time.monotonic() > deadline:
            skipped[impl] = "the section's time budget was spent"
        elif impl in inf.GPU_ONLY and not plan.cuda:
            skipped[impl] = f"on CPU ({inf.GPU_ONLY[impl]})"
        else:
            rows += inf.run_benchmark(model, [1], prompt, new_tokens, dtype, device, repeats, [impl], hbm_gbps)
    inf.add_ratios(rows, hbm_gbps)  # across implementations (int8 x engine)
    out.mkdir(parents=True, exist_ok=True)
    if rows:
        title = f"inference: {name} ({model.num_params() / 1e6:.1f}M params), {device}, batch 1"
        write_rows(out, "inference", rows, inf.print_table(rows, title), inf.DECODE_CHART)
    return rep.inference_figures(rows, skipped, plan.smoke), None


def _junit_counts(path: Path) -> dict[str, int]:
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for s in suites:
        for key in totals:
            totals[key] += int(s.get(key, 0))
    return {"passed": totals["tests"] - totals["failures"] - totals["errors"] - totals["skipped"],
            "failed": totals["failures"], "skipped": totals["skipped"], "errors": totals["errors"]}


def section_tests(plan: Plan, out: Path, timeout: float) -> tuple[list[Figure], None]:
    tests = _tests_dir()
    if tests is None:
        return [Figure("tests", "gpu tier", None, note="skipped: no tests/ folder (not a source checkout)")], None
    out.mkdir(parents=True, exist_ok=True)
    opts = "-ra -p no:cacheprovider"
    if plan.smoke:  # never run the suite from inside a test of it: only collect the GPU tier of one file
        cmd = [sys.executable, "-m", "pytest", "-o", f"addopts={opts}", "--collect-only", "-q", "-m", "gpu",
               str(tests / "unit" / "test_gpu.py")]
    else:
        cmd = [sys.executable, "-m", "pytest", "-o", f"addopts={opts} -n 4 --dist loadscope", "-m", "gpu",
               f"--junitxml={out / 'junit.xml'}", str(tests)]
    print(f"tests: {' '.join(cmd)}")
    try:
        proc = subprocess.run(cmd, cwd=tests.parent, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        (out / "pytest.log").write_text((exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else exc.stdout or "")
        return [Figure("tests", "gpu tier", None, note=f"failed: timed out after {timeout:.0f} s")], None
    (out / "pytest.log").write_text(proc.stdout + proc.stderr)
    if plan.smoke:
        match = re.search(r"(\d+)(?:/\d+)? tests? collected", proc.stdout)
        n = int(match.group(1)) if match else None
        return [Figure("tests", "gpu-marked tests collected (smoke: --collect-only, tests/unit/test_gpu.py)", n, "tests",
                       note=f"pytest exit {proc.returncode}")], None
    junit = out / "junit.xml"
    if not junit.is_file():
        tail = " ".join((proc.stdout + proc.stderr).split()[-30:])
        return [Figure("tests", "gpu tier", None, note=f"failed: pytest exit {proc.returncode}: {tail}")], None
    counts = _junit_counts(junit)
    return [Figure("tests", f"gpu tier {k}", v, "tests", note=f"pytest exit {proc.returncode}")
            for k, v in counts.items()], None


# --------------------------------------------------------------------------------------------------
# The suite
# --------------------------------------------------------------------------------------------------


def run_suite(out: Path, smoke: bool = False, skip: tuple[str, ...] = (), hbm_gbps: float | None = None,
              write_policy: bool = False, train_extra: tuple[str, ...] = (), argv: list[str] | None = None) -> list[Figure]:
    """Run every section not in `skip`, write gpu_suite.csv / .md to `out`, and return the figures. A section
    that raises is a failed figure with its error; the others still run."""
    from dsrecipes.benchmarks.inference import known_hbm_gbps

    cuda = torch.cuda.is_available()
    plan = Plan(smoke=smoke, cuda=cuda)
    hbm_gbps = hbm_gbps or (known_hbm_gbps(torch.cuda.get_device_name()) if cuda else None)
    out.mkdir(parents=True, exist_ok=True)
    figs: list[Figure] = []
    extra_md: dict[str, str] = {}
    times: dict[str, float] = {}
    for section in SECTIONS:
        if section in skip:
            print(f"== {section}: skipped (--skip)")
            continue
        print(f"== {section} (budget {BUDGET_S[section]:.0f} s)")
        start = time.monotonic()
        deadline = start + BUDGET_S[section]
        try:
            if section == "kernels":
                new, md = section_kernels(plan, out / "kernels", deadline, hbm_gbps, write_policy, out)
            elif section == "train":
                new, md = section_train(plan, out / "train", deadline, list(train_extra))
            elif section == "inference":
                new, md = section_inference(plan, out / "inference", deadline, hbm_gbps)
            else:
                new, md = section_tests(plan, out / "tests", BUDGET_S[section])
        except Exception as exc:  # one broken section must not lose the others' figures
            new, md = [Figure(section, f"{section} section", None, note=f"failed: {type(exc).__name__}: {exc}")], None
            print(f"{section}: failed: {type(exc).__name__}: {exc}")
        times[section] = time.monotonic() - start
        figs += new
        if md:
            extra_md[section] = md
        if cuda:
            torch.cuda.empty_cache()
    figs += rep.timing_figures(times, BUDGET_S, TOTAL_BUDGET_S, smoke)
    command = "python -m dsrecipes.benchmarks.gpu_suite " + " ".join(argv if argv is not None else sys.argv[1:])
    header = [f"GPU suite{' (smoke: tiny shapes, not measurements)' if smoke else ''}: {rep.hardware_line()}",
              "", f"Command: `{command.strip()}`" + (f"; HBM bandwidth {hbm_gbps:g} GB/s" if hbm_gbps else "")]
    csv_path, md_path = rep.write_suite(out, figs, header, extra_md)
    print(f"wrote {csv_path} and {md_path}")
    return figs


def main(argv: list[str] | None = None) -> list[Figure]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="folder for gpu_suite.csv/.md and the sections' own outputs")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes and models, few steps: runs on CPU")
    parser.add_argument("--skip", nargs="+", default=[], choices=SECTIONS, metavar="SECTION",
                        help=f"sections not to run: {' '.join(SECTIONS)}")
    parser.add_argument("--hbm-gbps", type=float, default=None,
                        help="device memory bandwidth in GB/s (default: by device name, H100 SXM 3350, H200 4800)")
    parser.add_argument("--write-policy", action="store_true",
                        help=f"copy the derived kernel policy over {POLICY_FILE.name} in the package (GPU runs only)")
    parser.add_argument("--train-extra", nargs="+", default=[], metavar="OVERRIDE",
                        help="overrides for every training variant, e.g. trainer.peak_tflops=989 data.cache_dir=/tmp/c")
    args = parser.parse_args(argv)
    return run_suite(Path(args.out), smoke=args.smoke, skip=tuple(args.skip), hbm_gbps=args.hbm_gbps,
                     write_policy=args.write_policy, train_extra=tuple(args.train_extra), argv=argv)


if __name__ == "__main__":
    main()
