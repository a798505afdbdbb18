"""Every example in README.md and in the documentation site (docs/) runs, so the docs cannot drift from the code.

The documents are README.md, then every page of mkdocs.yml's nav in nav order (tests/helpers/paths.py,
DOCUMENTS): their fenced ```bash / ```sh and ```python blocks are parsed here; each command line (`\\`
continuations joined, `#` comments dropped, `a && b` split) and each Python block becomes one test, whose id
names its page and line (`docs/zero.md:L12: ...`). The rules below apply to the whole set.

What runs, and how it is shortened (the commands themselves are run as written):
  * `python -m dsrecipes ARGS` goes through the real CLI entry (dsrecipes.__main__.main with sys.argv),
    all commands in one helper interpreter (tests/helpers/doc_example_runner.py) so torch, Hydra and the data
    stack are imported once. Training commands get SHORTEN appended (2 steps, one eval batch, a 4-token
    sample, 300 kB of the corpus, one shared datasets cache): a key the command sets itself is replaced,
    never given twice. EXTRA adds a few keys to named heavy commands (each with its reason). Every run
    writes to its own folder under the test's tmp dir (hydra.run.dir / hydra.sweep.dir).
  * `python -m dsrecipes.<module> ARGS` runs the same way through runpy (MODULE_ARGS shortens benchmarks).
  * `torchrun ...` and Python blocks run as subprocesses (torchrun's rendezvous on a free port, through
    PET_MASTER_PORT, so parallel test workers never collide).
  * Identical commands run once (on any page); later copies pass or fail with the first.
  * Examples that need an earlier one's output are chained in document order (README.md, then the pages in
    nav order, each top to bottom) in one tmp dir: PLACEHOLDERS maps the `outputs/<date>/<time>_gpt`-style
    names to the run that produces them, and FILES writes the inputs a command names (`corpus/`,
    `tok/tokenizer.json`, `prompts.txt`; it copies `examples/ds_config.json`). RERUN runs a command a second
    time where the docs say to re-run it. A chain stays on one page, or runs from an earlier page to a later one.
  * PRELUDES defines the names a Python block leaves to the reader (`my_module`, `my_dataset`, `loss_fn`);
    INLINE runs the few Python calls written inline in the prose.
  * Passing means exit status 0, and for a training run a summary.json with the end-of-run text sample
    (pipelines skip the sample); the re-run must say it resumed from the first run's checkpoint.

What is not run, never silently: a command matching a SKIP rule, or a block right after a
`<!-- readme-test: skip (REASON) -->` line, is reported as a skipped test with its reason. A command
matching VALIDATE_ONLY (multi-worker recipes another test runs across processes) goes as far as the
CLI's launch of its workers and is then reported as skipped with its reason; DSRECIPES_README_ALL=1
runs those in full. Every rule must still match something in the documents, and a command of an unknown
kind fails until it gets a rule. Cost: about 3 minutes of CPU on 2 cores (one `python -m dsrecipes`
training run in the shared interpreter is 2-4 s; a 2-worker one ~25 s, mostly the workers' imports).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.helpers.environment import subprocess_env
from tests.helpers.paths import DOCUMENTS, HELPERS, REPO

ROOT = REPO
RUNNER = HELPERS / "doc_example_runner.py"

# ------------------------------------------------------------------------------------------------
# The rules
# ------------------------------------------------------------------------------------------------

# (regex searched in the command, reason): commands CI cannot run. Each must match a documented command.
SKIP = [
    (r"^pip install ", "installs packages: the suite runs on the project CI already installed (.ci/run)"),
    (r"^pytest\b", "runs the whole test suite, which this test is part of"),
    (r"^torchrun --nnodes 2 ", "multi-node: needs a second host (HOST:29500 is a placeholder)"),
    (r"^torchrun --nproc-per-node 8 ", "8 ranks: one GPU node's worth of processes; CI has 2 CPU cores (the "
                                       "joined torchrun path runs below with mode=generate at 2 ranks)"),
    (r"^python -m dsrecipes\.benchmarks\.inference .*--hbm-gbps", "needs a GPU: a 1.3B model measured against HBM "
                                                                  "bandwidth"),
    (r"\bfp8=(tensorwise|rowwise)", "needs a CUDA GPU with compute capability >= 8.9: refused on CPU before any work "
                                    "(tests/unit/test_float8.py checks the refusal and the conversion on CPU)"),
    (r"^python -m dsrecipes\.benchmarks\.gpu_suite --out", "needs a GPU (about 8 minutes on an H100/H200); its --smoke "
                                                           "example runs in tests/integration/test_gpu_suite.py"),
    (r"^python -m dsrecipes\.benchmarks\.gpu_suite --smoke", "tests/integration/test_gpu_suite.py runs this CPU smoke "
                                                             "(in-process, ~16 s) and checks both tables, every section"),
]

# (regex, reason): multi-worker recipes whose layout another test already runs across processes. Each
# worker costs ~10 s of CPU before it trains, too much for this file's budget on 2 CI cores, so they
# run up to the point where the CLI starts its workers (composition, recipe validation at their world
# size, the run directory) and are then reported as skipped with the reason. DSRECIPES_README_ALL=1
# runs them in full (all passed when this rule was written). Each must match a documented command.
TABLE = "tests/integration/equivalence/table.py"  # the layout-equivalence table: each row one run against one process
VALIDATE_ONLY = [
    (r"launcher\.nproc_per_node=4", f"4 workers; ZeRO and dp 2 x tp 2 under ZeRO-3 at world 4: rows of {TABLE}"),
    (r"\+experiment=gpt_3d", f"8 workers; dp 2 x tp 2 x pp 2 at world 8: row dp2xtp2xpp2 of {TABLE}"),
    (r"\+experiment=gpt_tp\b", f"2 workers; TP=2 through the CLI: row tp2 of {TABLE}"),
    (r"\+experiment=gpt_ulysses_long\b", f"2 workers; SP=2 through the CLI: rows sp2, sp2-zero3 of {TABLE}"),
    (r"\+experiment=gpt_pp\b", f"2 workers; PP=2 (every schedule): rows pp2-* of {TABLE}"),
    (r"\+experiment=gpt_moe_ep\b", f"2 workers; EP=2: rows ep2-* of {TABLE}"),
    (r"optimizer=(onebitadam|zerooneadam|onebitlamb)", "2 workers; the 1-bit optimizers at world 2: "
                                                       "tests/integration/test_onebit.py (and the communication "
                                                       "benchmark's example in docs/zero.md)"),
    (r"zero\.zero_quantized_weights=true", "2 workers; ZeRO++ at world 2: tests/integration/test_zeropp.py"),
    (r"\+experiment=(sft|sft_lora|dpo)\b", "2 workers at ZeRO-3; sft and dpo run shortened (to a lower "
                                          "validation loss than at their start) in tests/integration/"
                                          f"test_fine_tuning.py, their layouts in rows sft-*, lora-*, dpo-* of {TABLE}"),
    (r"compile=blocks zero\.stage=3 launcher\.nproc_per_node=2", "2 workers; compile=blocks under ZeRO-3 (and DDP, tp 2, "
                                                                  f"with checkpointing): rows compile-* of {TABLE}"),
    (r"comms_logger=enabled zero\.stage=2", "2 workers; the comms logger in a world-2 Trainer: "
                                             "tests/integration/test_comms_logger.py (and through the CLI: the "
                                             "communication benchmark's example in docs/zero.md)"),
]
RUN_ALL = os.environ.get("DSRECIPES_README_ALL") == "1"

# Appended to every training command (a key the command already sets is replaced).
SHORTEN = [
    "trainer.max_steps=2",
    "trainer.eval_interval=0",
    "trainer.eval_batches=1",
    "trainer.log_interval=1",
    "trainer.sample_tokens=4",
    "trainer.progress_bar=false",
    "data.max_bytes=300000",
]
SHORTEN_GENERATE = ["generate.max_new_tokens=4"]
SHORTEN_SERVE_BENCH = ["generate.bench_batch_sizes=[1,2]", "generate.bench_prompt_len=8", "generate.bench_new_tokens=4",
                       "generate.bench_repeats=1"]

# (regex, extra overrides, reason) for commands whose recipe is heavy even at 2 steps.
EXTRA = [
    (r"precision=(bf16|fp16)|\+experiment=gpt_zero3", ["data.block_size=32"],
     "bf16/fp16 matmuls are emulated on CPUs without AVX-512 BF16/FP16 (~5x fp32): 32-token blocks"),
    (r"model=gpt2_124m", ["model.max_seq_len=64", "trainer.train_micro_batch_size_per_gpu=2", "model.n_layer=2",
                          "checkpoint.save_final=false", "checkpoint.export_safetensors=false"],
     "124M parameters: 2 of its 12 layers (the example is about the files and the tokenizer), short sequences, "
     "2 per batch, no 1.5 GB checkpoint"),
    (r"profiler=trace", ["trainer.max_steps=4"],
     "the trace's schedule skips 1 step and warms up 1 before it records (2 steps would record none: refused)"),
]

# Module commands: (regex, args appended ({cache}: the shared datasets cache), reason).
MODULE_ARGS = [
    (r"^python -m dsrecipes\.benchmarks\.data_efficiency", ["--steps", "4", "--seq", "32", "--micro-batch", "2",
                                                            "--eval-interval", "2", "--eval-batches", "1",
                                                            "--max-bytes", "300000", "--cache-dir", "{cache}"],
     "4 variants x 4 steps instead of x 100"),
    (r"^python -m dsrecipes\.benchmarks\.fine_tuning", ["--model", "gpt_debug", "--steps", "2", "--rounds", "1",
                                                        "--block", "128", "--micro", "2"],
     "gpt_debug's optimizer state and 2 steps of each packing instead of gpt2_124m and 30 x 2 rounds"),
    (r"^python -m dsrecipes\.benchmarks\.optimizers", ["--model", "gpt_debug", "--steps", "2", "--eval-batches", "1",
                                                       "--max-bytes", "300000", "--cache-dir", "{cache}",
                                                       "--variants", "adamw,adamw_bf16_state,muon"],
     "gpt_debug for 2 steps, without adamw8bit (its compile: tests/integration/test_adamw8bit.py trains it), "
     "instead of gpt_tiny x 200 steps x 4 optimizers"),
    (r"^python -m dsrecipes\.benchmarks\.communication", ["--world-size", "2", "--steps", "4", "--freeze", "2",
                                                           "--log-interval", "1", "--eval-batches", "1", "--max-bytes",
                                                           "300000", "--variants", "onebitadam", "--cache-dir", "{cache}"],
     "adamw vs onebitadam at world 2 for 4 steps (freeze at 2) instead of 19 runs x 400 steps"),
]

# A documented command that says to re-run it: run twice. The first run is shortened to 1 step (the
# "preemption"); the re-run must resume from its checkpoint and finish step 2.
RERUN = [r"trainer\.resume=auto"]

# Placeholders in commands and Python blocks -> (producing command, path inside its run directory).
PLACEHOLDERS = {
    "outputs/<date>/<time>_gpt": ("python -m dsrecipes", ""),
    "<run dir>": ("python -m dsrecipes", ""),
    "outputs/<teacher run>/export": ("python -m dsrecipes", "export"),  # gpt_layer_reduction's teacher: gpt_tiny
    "outputs/<run>/checkpoints": ("python -m dsrecipes +experiment=gpt_zero3", "checkpoints"),  # a sharded checkpoint
}

PRELUDES = {
    "dsrecipes.initialize(": '''
import torch
from torch import nn

torch.manual_seed(0)
my_module = nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 1))
my_dataset = torch.utils.data.TensorDataset(torch.randn(128, 8), torch.randn(128, 1))  # 2 steps of 64
loss_fn = nn.functional.mse_loss
''',
}


# Python written inline in the documents' prose (`code` spans) that is run too: (the span, exactly, and a
# check run after it; `run_dir` is the default run's directory).
INLINE = [
    ("model, config = dsrecipes.models.load_exported(dir)",
     "dir = run_dir / 'export'\n{span}\nassert isinstance(model, dsrecipes.models.GPT) and config['model']['name']\n"
     "assert model(torch.tensor([[1, 2, 3]])).logits.shape[:2] == (1, 3)"),
    ('dsrecipes.models.GPT(dsrecipes.models.load_flavor("llama_7b", vocab_size=32000))',
     "with torch.device('meta'):\n    model = {span}\nassert 6e9 < model.num_params() < 7e9 and model.flops_per_token() > 0"),
]


def _write_corpus(cwd: Path) -> None:
    corpus = cwd / "corpus"
    corpus.mkdir()
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for name in ("textwrap.py", "shlex.py", "fnmatch.py", "colorsys.py"):
        shutil.copy(stdlib / name, corpus / name)


def _write_tokenizer(cwd: Path) -> None:
    tokenizers = pytest.importorskip("tokenizers", reason="tokenizers (the dev extra) builds tok/tokenizer.json")
    tok = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(vocab_size=400, special_tokens=["[UNK]", "<|endoftext|>"])
    tok.train([str(p) for p in sorted((cwd / "corpus").iterdir())], trainer)
    (cwd / "tok").mkdir()
    tok.save(str(cwd / "tok" / "tokenizer.json"))


def _copy_example(name: str):
    def copy(cwd: Path) -> None:
        (cwd / "examples").mkdir(exist_ok=True)
        shutil.copy(ROOT / "examples" / name, cwd / "examples" / name)
    return copy


# Inputs the commands name: written into the shared working directory before anything runs.
FILES = {
    "data.paths=[corpus/]": _write_corpus,
    "data.tokenizer=tok/tokenizer.json": _write_tokenizer,
    "generate.prompts_file=prompts.txt": lambda cwd: (cwd / "prompts.txt").write_text("def \nclass \nimport os\n"),
    "examples/ds_config.json": _copy_example("ds_config.json"),
    "examples/hostfile": _copy_example("hostfile"),
}

# ------------------------------------------------------------------------------------------------
# Parsing
# ------------------------------------------------------------------------------------------------

FENCE = re.compile(r"^```([\w-]*)[^\n]*\n(.*?)^```[ \t]*$", re.S | re.M)
MARKER = re.compile(r"<!--\s*readme-test:\s*skip\s*\((.+)\)\s*-->\s*\Z")
SHELL = {"bash", "sh", "shell", "console"}
COMMAND_START = re.compile(r"^\s*(python3?|torchrun|pip|pytest) ", re.M)


@dataclass
class Example:
    line: int  # the document's line of the command (or of the block's first line)
    kind: str  # "command" | "python"
    text: str  # the command line (normalized) or the Python source
    argv: list[str] = field(default_factory=list)
    marker: str | None = None  # the readme-test skip reason of its block
    doc: str = "README.md"  # the document, relative to the repository root

    @property
    def id(self) -> str:
        head = show(" ".join(self.argv[:6])) if self.kind == "command" else self.text.strip().splitlines()[0]
        return f"{self.doc}:L{self.line}: {head[:70]}"

    @property
    def where(self) -> str:
        return f"{self.doc} line {self.line}"


def _token(index: int) -> str:
    return f"@PLACEHOLDER{index}@"


def show(text: str) -> str:
    """A command with its placeholder tokens written back as the document has them."""
    for i, placeholder in enumerate(PLACEHOLDERS):
        text = text.replace(_token(i), placeholder)
    return text


def fenced_blocks(text: str):
    """(language, first body line number, body, skip marker reason or None) for every fenced block."""
    for match in FENCE.finditer(text):
        before = text[:match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = MARKER.search(before.strip())
        yield match.group(1), text.count("\n", 0, match.start(2)) + 1, match.group(2), marker and marker.group(1)


def shell_commands(body: str, first_line: int):
    """(line, command text, argv) per command: continuations joined, comments dropped, && split.

    Known placeholders (`outputs/<date>/<time>_gpt`: a shell would read `<` as a redirection) become
    tokens first; Plan.substitute later puts the producing run's path there.
    """
    lines = body.split("\n")
    i = 0
    while i < len(lines):
        start, logical = i, lines[i]
        while logical.endswith("\\") and i + 1 < len(lines):
            i += 1
            logical = logical[:-1] + " " + lines[i].strip()
        i += 1
        for index, placeholder in enumerate(PLACEHOLDERS):
            logical = logical.replace(placeholder, _token(index))
        tokens = shlex.split(logical, comments=True)
        while tokens:
            cut = tokens.index("&&") if "&&" in tokens else len(tokens)
            argv, tokens = tokens[:cut], tokens[cut + 1:]
            if argv:
                yield first_line + start, shlex.join(argv), argv


def _name(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


def doc_examples(text: str, doc: str = "README.md") -> list[Example]:
    """The examples of one document, top to bottom."""
    out = []
    for lang, line, body, marker in fenced_blocks(text):
        if lang in SHELL:
            out += [Example(n, "command", cmd, argv, marker, doc) for n, cmd, argv in shell_commands(body, line)]
        elif lang == "python":
            out.append(Example(line, "python", body, marker=marker, doc=doc))
    return out


def all_examples() -> list[Example]:
    """Every document's examples, in DOCUMENTS order (README.md, then the site's pages in nav order)."""
    return [e for path in DOCUMENTS for e in doc_examples(path.read_text(), _name(path))]


def all_text() -> str:
    return "\n".join(path.read_text() for path in DOCUMENTS)


def skip_reason(example: Example) -> str | None:
    if example.marker:
        return example.marker
    if example.kind == "command":
        for pattern, reason in SKIP:
            if re.search(pattern, example.text):
                return reason
    return None


def command_kind(argv: list[str]) -> str | None:
    """'dsrecipes' (the CLI), 'module' (python -m dsrecipes.X), 'torchrun', or None (no rule)."""
    if argv[:3] == ["python", "-m", "dsrecipes"]:
        return "dsrecipes"
    if argv[:2] == ["python", "-m"] and len(argv) > 2 and argv[2].startswith("dsrecipes."):
        return "module"
    if argv[0] == "torchrun" and "-m" in argv and argv[argv.index("-m") + 1] == "dsrecipes":
        return "torchrun"
    return None


EXAMPLES = all_examples()

# ------------------------------------------------------------------------------------------------
# Building the plan
# ------------------------------------------------------------------------------------------------


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def with_overrides(args: list[str], extra: list[str]) -> list[str]:
    """args + extra, where an extra key the args already set replaces that value in place."""
    keys = {_key(o): o for o in extra}
    out = [keys.pop(_key(a)) if "=" in a and _key(a) in keys else a for a in args]
    return out + [o for o in extra if _key(o) in keys]


def _mode(args: list[str]) -> str:
    for a in args:
        if a.startswith("mode="):
            return a.split("=", 1)[1]
    return "train"


def _run_name(args: list[str]) -> str:
    for a in args:
        if a.startswith("+experiment="):
            return a.split("=", 1)[1]
    return "gpt"


class Plan:
    def __init__(self, tmp: Path, datasets_cache: str):
        self.tmp, self.cwd, self.cache = tmp, tmp / "work", datasets_cache
        self.cwd.mkdir()
        self.steps: list[dict] = []
        self.by_text: dict[str, str] = {}  # normalized command -> id of the step that ran it
        self.run_dirs: dict[str, Path] = {}  # normalized command -> its (first) run directory
        self.owner: dict[str, list[str]] = {}  # example id -> the step ids that decide it
        self.written: set[str] = set()  # FILES already written
        self.skipped: dict[str, str] = {}  # example id -> why its input could not be written
        self.expect: dict[str, list[tuple[Path, str | None]]] = {}  # example id -> (file that must exist, text in it)

    def _step(self, example: Example, kind: str, argv: list[str], display: str, env: dict | None = None) -> str:
        sid = f"s{len(self.steps):02d}"
        self.steps.append({"id": sid, "kind": kind, "argv": argv, "cwd": str(self.cwd), "display": show(display),
                           "log": str(self.tmp / "logs" / f"{sid}.log"), "env": env or {}})
        self.owner.setdefault(example.id, []).append(sid)
        return sid

    def substitute(self, text: str) -> str:
        """Placeholders (or their tokens) -> the path of the earlier run that produces them."""
        for index, (placeholder, (producer, sub)) in enumerate(PLACEHOLDERS.items()):
            for written in (placeholder, _token(index)):
                if written in text:
                    if producer not in self.run_dirs:
                        raise AssertionError(f"{placeholder!r} needs `{producer}` to run before it: earlier on its "
                                             "page, or on an earlier document (README.md, then mkdocs.yml's nav order)")
                    text = text.replace(written, str(self.run_dirs[producer] / sub).rstrip("/"))
        left = re.findall(r"<[a-z][^<>]*>", text)
        assert not left, f"no rule for the placeholder(s) {left}: add them to PLACEHOLDERS"
        return text

    def _run_dir(self, index: int, name: str, attempt: int = 0) -> Path:
        # outputs/<date>/<time>_<name> under a folder of its own, so trainer.resume=auto sees only its own runs
        return self.tmp / "runs" / f"{index:02d}" / "outputs" / "day" / f"00-00-0{attempt}_{name}"

    def add(self, example: Example) -> None:
        if example.kind == "python":
            source = self.substitute(example.text)
            prelude = "".join(code for needle, code in PRELUDES.items() if needle in source)
            script = self.tmp / f"block_{re.sub(r'[^A-Za-z0-9]+', '_', example.doc)}_L{example.line}.py"
            script.write_text(prelude + "\n" + source)
            self._step(example, "process", [sys.executable, str(script)], f"python block at {example.where}")
            return
        if example.text in self.by_text:  # an identical command ran already
            self.owner[example.id] = self.owner[self.by_text[example.text]]
            return
        self.by_text[example.text] = example.id
        argv = shlex.split(self.substitute(example.text))
        for needle, write in FILES.items():
            if needle in example.text and needle not in self.written:
                try:
                    write(self.cwd)
                except pytest.skip.Exception as missing:  # an optional package builds the input
                    self.skipped[example.id] = str(missing)
                    del self.by_text[example.text]
                    return
                self.written.add(needle)
        kind = command_kind(argv)
        if kind == "module":
            extra = [a.format(cache=self.cache) for pattern, args, _ in MODULE_ARGS if re.search(pattern, example.text)
                     for a in args]
            self._step(example, "module", argv[2:] + extra, example.text)
        elif kind == "torchrun":
            at = argv.index("-m")
            args = with_overrides(argv[at + 2:], self._shortening(argv[at + 2:], len(self.steps)))
            cmd = [sys.executable, "-m", "torch.distributed.run", *argv[1:at], "-m", "dsrecipes", *args]  # = torchrun
            self._step(example, "process", cmd, example.text, env={"PET_MASTER_PORT": "{free_port}"})
        else:
            args = argv[3:]
            index = len(self.steps)
            run_dir = self._run_dir(index, _run_name(args))
            rerun = any(re.search(p, example.text) for p in RERUN)
            first = with_overrides(args, self._shortening(args, index))
            if rerun:
                first = with_overrides(first, ["trainer.max_steps=1"])
            kind = "dsrecipes-validate" if validate_only(example) else "dsrecipes"
            self._step(example, kind, first, example.text)
            self.run_dirs.setdefault(example.text, run_dir)
            if rerun:
                again = with_overrides(args, self._shortening(args, index, attempt=1))
                self._step(example, "dsrecipes", again, example.text + "   # re-run")
                self.expect[example.id] = [(self._run_dir(index, _run_name(args), 1) / "logs" / "rank0.log",
                                            f"resumed from {run_dir}/checkpoints/step_1 at step 1")]
            elif _mode(args) == "serve-bench":  # the docs: the table lands in the command's own run directory
                self.expect[example.id] = [(self._run_dir(index, "serve-bench") / "serve_bench.csv", None)]
            elif kind == "dsrecipes" and _mode(args) == "train" and not any(a.startswith("-") for a in args) \
                    and args[:1] != ["report"]:
                pipeline = re.search(r"gpt_pp|gpt_3d|parallel\.pp=", example.text)  # the sample is skipped there
                self.expect[example.id] = [(run_dir / "summary.json", None if pipeline else '"sample": "')]

    def _shortening(self, args: list[str], index: int, attempt: int = 0) -> list[str]:
        if any(a.startswith("--") for a in args) or args[:1] == ["report"]:  # --help, --cfg job, report: nothing trains
            return []
        mode = _mode(args)
        if mode in ("generate", "serve-bench"):
            shorten = SHORTEN_GENERATE if mode == "generate" else SHORTEN_SERVE_BENCH
            return [*shorten, f"hydra.run.dir={self._run_dir(index, mode, attempt)}"]
        text = " ".join(args)
        extra = [o for pattern, overrides, _ in EXTRA if re.search(pattern, text) for o in overrides]
        if "-m" in args or "--multirun" in args:
            where = [f"hydra.sweep.dir={self.tmp / 'runs' / f'{index:02d}' / 'multirun'}"]
        else:
            where = [f"hydra.run.dir={self._run_dir(index, _run_name(args), attempt)}"]
        return [*SHORTEN, f"data.cache_dir={self.cache}", *extra, *where]


def validate_only(example: Example) -> str | None:
    if RUN_ALL:
        return None
    for pattern, reason in VALIDATE_ONLY:
        if re.search(pattern, example.text):
            return reason
    return None


# ------------------------------------------------------------------------------------------------
# Fast checks of the rules themselves (the quick loop)
# ------------------------------------------------------------------------------------------------


def test_docs_have_examples_and_every_command_block_is_labelled():
    assert sum(e.kind == "command" for e in EXAMPLES) >= 30 and sum(e.kind == "python" for e in EXAMPLES) >= 2
    assert len({e.id for e in EXAMPLES}) == len(EXAMPLES)  # one test per example
    assert {e.doc for e in EXAMPLES} > {"README.md"}  # the site's pages are read too
    for path in DOCUMENTS:
        for lang, line, body, _ in fenced_blocks(path.read_text()):
            if lang not in SHELL and lang != "python":
                assert not COMMAND_START.search(body), (f"{_name(path)} line {line}: a fenced block with commands must "
                                                        "be ```bash (or ```python) to be tested")


def test_every_skip_rule_matches_a_documented_command():
    text = all_text()
    for pattern, reason in SKIP:
        assert any(e.kind == "command" and re.search(pattern, e.text) for e in EXAMPLES), (
            f"SKIP rule {pattern!r} ({reason}) matches no documented command any more: remove it")
    for pattern, reason in VALIDATE_ONLY:
        assert any(re.search(pattern, e.text) for e in EXAMPLES), f"rule {pattern!r} ({reason}) matches nothing"
    for span, _ in INLINE:
        assert f"`{span}`" in text, f"no document has `{span}` any more: update INLINE"
    for table in (EXTRA, MODULE_ARGS):
        for pattern, _, reason in table:
            assert any(re.search(pattern, e.text) for e in EXAMPLES), f"rule {pattern!r} ({reason}) matches nothing"


def test_every_command_is_run_or_skipped_by_a_rule():
    for e in EXAMPLES:
        if e.kind == "command" and skip_reason(e) is None:
            assert command_kind(e.argv) is not None, (
                f"{e.where}: no rule runs or skips `{e.text}`; add one to tests/docs/test_doc_examples.py")
            assert not any(c in e.text for c in "<>|;$`"), (
                f"{e.where}: `{show(e.text)}` has shell syntax or a placeholder with no rule (PLACEHOLDERS)")


def test_parsing_joins_continuations_splits_and_and_drops_comments():
    body = 'pip install -e . && python -m dsrecipes   # comment\npython -m dsrecipes a=1 \\\n    b="x y"\n'
    got = [(n, argv) for n, _, argv in shell_commands(body, 10)]
    assert got == [(10, ["pip", "install", "-e", "."]), (10, ["python", "-m", "dsrecipes"]),
                   (11, ["python", "-m", "dsrecipes", "a=1", "b=x y"])]
    text = "x\n<!-- readme-test: skip (needs a GPU) -->\n```bash\npython -m dsrecipes\n```\n"
    assert [(e.marker, e.argv, e.id) for e in doc_examples(text, "docs/x.md")] == [
        ("needs a GPU", ["python", "-m", "dsrecipes"], "docs/x.md:L4: python -m dsrecipes")]
    assert with_overrides(["a=1", "trainer.max_steps=20"], ["trainer.max_steps=2", "b=3"]) == \
        ["a=1", "trainer.max_steps=2", "b=3"]


# ------------------------------------------------------------------------------------------------
# Running them
# ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def doc_run(tmp_path_factory, datasets_cache):
    """Run every runnable example in document order (one helper interpreter); (plan, results)."""
    tmp = tmp_path_factory.mktemp("docs")
    (tmp / "logs").mkdir()
    plan = Plan(tmp, datasets_cache)
    for example in EXAMPLES:
        if skip_reason(example) is None:
            plan.add(example)
    (tmp / "plan.json").write_text(json.dumps(plan.steps, indent=1))
    env = subprocess_env(OMP_NUM_THREADS="1", HF_HOME=str(tmp / "hf_home"),  # nothing written outside the tmp dir
                         PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    results_path = tmp / "results.json"
    proc = subprocess.run([sys.executable, str(RUNNER), str(tmp / "plan.json"), str(results_path)], cwd=plan.cwd,
                          env=env, capture_output=True, text=True, timeout=2400)
    results = json.loads(results_path.read_text()) if results_path.exists() else {}
    return plan, results, proc


def _log_tail(step: dict, n: int = 4000) -> str:
    path = Path(step["log"])
    return path.read_text(errors="replace")[-n:] if path.exists() else "(no log)"


@pytest.mark.slow
@pytest.mark.timeout(2500)
@pytest.mark.parametrize("example", EXAMPLES, ids=[e.id for e in EXAMPLES])
def test_doc_example(example, doc_run):
    reason = skip_reason(example)
    if reason:
        pytest.skip(f"{example.where}: {reason}")
    plan, results, proc = doc_run
    if example.id in plan.skipped:
        pytest.skip(f"{example.where}: {plan.skipped[example.id]}")
    steps = {s["id"]: s for s in plan.steps}
    for sid in plan.owner[example.id]:
        step = steps[sid]
        assert sid in results, (f"`{step['display']}` did not finish (runner rc {proc.returncode}):\n"
                                f"{_log_tail(step)}\n{proc.stderr[-2000:]}")
        assert results[sid]["rc"] == 0, f"`{step['display']}` failed (rc {results[sid]['rc']}):\n{_log_tail(step)}"
    last = steps[plan.owner[example.id][-1]]
    for path, text in plan.expect.get(example.id, []):  # trained to the end and sampled; resumed; wrote its table
        assert path.exists(), f"`{last['display']}` wrote no {path}:\n{_log_tail(last)}"
        assert text is None or text in path.read_text(), f"{path} lacks {text!r}:\n{path.read_text()[-3000:]}"
    reason = validate_only(example)
    if reason:
        assert re.search(r"spawn_workers: \d+ workers not started", Path(last["log"]).read_text()), _log_tail(last)
        pytest.skip(f"{example.where}: validated, workers not started (DSRECIPES_README_ALL=1 runs it): "
                    f"{reason}")


@pytest.mark.slow
@pytest.mark.parametrize("span, check", INLINE, ids=[span[:40] for span, _ in INLINE])
def test_doc_inline_python(span, check, doc_run):
    import torch

    import dsrecipes.models

    assert f"`{span}`" in all_text(), f"no document has `{span}` any more: update INLINE"
    plan, results, _ = doc_run
    exec(check.format(span=span), {"dsrecipes": dsrecipes, "torch": torch,
                                   "run_dir": plan.run_dirs["python -m dsrecipes"]})
