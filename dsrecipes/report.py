"""`python -m dsrecipes report`: what this machine has and which dsrecipes features can run on it (DeepSpeed's `ds_report`).

    python -m dsrecipes report           # three rich tables: versions, devices, features
    python -m dsrecipes report --json    # the same facts as one JSON object (for bug reports and scripts)
    dsrecipes report                     # the console script, the same

Versions come from the installed distributions' metadata (importlib.metadata), so a slow-to-import package
such as wandb is never imported. Every probe is guarded: one that raises shows `error: <type>: <message>` in its
cell and the report goes on; a report that needs the report to work is no use on a broken install.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import platform
import sys
from collections.abc import Callable
from typing import Any

import torch

# (label, distribution name) of the packages a recipe may use; the optional ones read "not installed" when absent
PACKAGES = (
    ("torch", "torch"),
    ("triton", "triton"),
    ("hydra-core", "hydra-core"),
    ("omegaconf", "omegaconf"),
    ("datasets", "datasets"),
    ("safetensors", "safetensors"),
    ("tokenizers", "tokenizers"),
    ("rich", "rich"),
    ("tensorboard", "tensorboard"),
    ("wandb", "wandb"),
    ("transformers", "transformers"),
    ("deepspeed", "deepspeed"),
    ("matplotlib", "matplotlib"),
    ("optuna", "optuna"),
    ("hydra-optuna-sweeper", "hydra-optuna-sweeper"),
    ("hydra-submitit-launcher", "hydra-submitit-launcher"),
    ("dsrecipes", "dsrecipes"),
)
NOT_INSTALLED = "not installed"


def guarded(probe: Callable[[], Any]) -> Any:
    """probe(), or "error: <type>: <message>" when it raises: one broken probe never ends the report."""
    try:
        return probe()
    except Exception as error:  # a report must survive any broken install
        message = str(error).splitlines()[0] if str(error) else ""
        return f"error: {type(error).__name__}: {message}" if message else f"error: {type(error).__name__}"


def _distribution_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return NOT_INSTALLED


def _nccl_version() -> str:
    if not torch.cuda.is_available() and not torch.version.cuda:
        return "- (no CUDA build)"
    version = torch.cuda.nccl.version()
    return ".".join(str(v) for v in version) if isinstance(version, tuple) else str(version)


def versions() -> dict[str, str]:
    """Python, torch's CUDA / ROCm / cuDNN / NCCL builds, then every package of PACKAGES."""
    out = {
        "python": guarded(lambda: f"{platform.python_version()} ({platform.python_implementation()}, {sys.executable})"),
        "platform": guarded(platform.platform),
        "torch CUDA build": guarded(lambda: torch.version.cuda or "- (not a CUDA build)"),
        "torch ROCm (HIP) build": guarded(lambda: getattr(torch.version, "hip", None) or "- (not a ROCm build)"),
        "cuDNN": guarded(lambda: str(torch.backends.cudnn.version() or "-")),
        "NCCL": guarded(_nccl_version),
    }
    for label, distribution in PACKAGES:
        out[label] = guarded(lambda d=distribution: _distribution_version(d))
    return out


def _ram_gib() -> float:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30


def _usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _cuda_device(index: int) -> dict[str, Any]:
    props = torch.cuda.get_device_properties(index)
    return {
        "name": props.name,
        "capability": f"sm_{props.major}{props.minor}",
        "memory_gib": round(props.total_memory / 2**30, 2),
        "multiprocessors": getattr(props, "multi_processor_count", None),
    }


def devices() -> dict[str, Any]:
    """The CPU (cores, usable cores, RAM, SIMD level, torch threads) and every CUDA / ROCm device."""
    cpu = {
        "processor": guarded(lambda: platform.processor() or platform.machine()),
        "cores": guarded(lambda: os.cpu_count()),
        "usable cores": guarded(_usable_cores),
        "torch threads": guarded(torch.get_num_threads),
        "RAM GiB": guarded(lambda: round(_ram_gib(), 1)),
        "SIMD": guarded(torch.backends.cpu.get_cpu_capability),
    }
    count = guarded(lambda: torch.cuda.device_count() if torch.cuda.is_available() else 0)
    gpus = [guarded(lambda i=i: _cuda_device(i)) for i in range(count)] if isinstance(count, int) else []
    return {"cpu": cpu, "cuda_device_count": count, "cuda": gpus}


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _backend(name: str, available: Callable[[], bool], needs_cuda: bool) -> tuple[str, str]:
    if not torch.distributed.is_available():
        return "no", "this torch build has no torch.distributed"
    if not available():
        return "no", f"this torch build has no {name}"
    if needs_cuda and not torch.cuda.is_available():
        return "no", f"built in, but {name} needs CUDA devices (none here)"
    return "yes", ""


def _triton() -> tuple[str, str]:
    if importlib.util.find_spec("triton") is None:
        return "no", "triton is not installed: kernels.backend=torch only"
    if os.environ.get("TRITON_INTERPRET") == "1":
        return "interpreter", "TRITON_INTERPRET=1: kernels run on CPU tensors (fp32, slow; for tests)"
    if torch.cuda.is_available():
        return "compiled", "kernels.backend=triton (or auto) compiles for the GPU"
    return "interpreter only", "no GPU: set TRITON_INTERPRET=1 to run the kernels on CPU (fp32, slow)"


def _fused_adamw_on(device: str) -> bool:
    probe = torch.zeros(1, device=device, requires_grad=True)
    probe.grad = torch.zeros_like(probe)
    try:
        torch.optim.AdamW([probe], fused=True).step()
    except (RuntimeError, ValueError, TypeError, NotImplementedError):
        return False
    return True


def _fused_optimizers() -> tuple[str, str]:
    cuda = torch.cuda.is_available() and _fused_adamw_on("cuda")
    cpu = _fused_adamw_on("cpu")
    where = [name for name, ok in (("cuda", cuda), ("cpu", cpu)) if ok]
    note = "optimizer.impl=auto takes fused on CUDA parameters, foreach elsewhere; impl=fused forces it"
    return ("yes (" + ", ".join(where) + ")" if where else "no"), note


def _cuda_graphs() -> tuple[str, str]:
    if not torch.cuda.is_available():
        return "no", "needs CUDA (generate.cuda_graph=true)"
    return ("yes", "generate.cuda_graph=true") if hasattr(torch.cuda, "CUDAGraph") else ("no", "torch.cuda.CUDAGraph missing")


def _bf16() -> tuple[str, str]:
    if torch.cuda.is_available():
        supported = torch.cuda.is_bf16_supported()
        return ("yes" if supported else "no"), "CUDA" + ("" if supported else ": use precision=fp16 (sm_80+ has bf16)")
    flags = _cpu_flags()
    fast = sorted(flags & {"amx_bf16", "avx512_bf16"})
    if fast:
        return "yes (CPU)", f"CPU with {', '.join(fast)}"
    return "runs (CPU)", "no bf16 instructions found on this CPU: bf16 runs but its speed is unknown, likely slow"


def _fp16() -> tuple[str, str]:
    if torch.cuda.is_available():
        return "yes", "CUDA (precision=fp16 with the dynamic loss scaler)"
    return "runs (CPU)", "no CUDA: fp16 math on CPU is slow; precision=fp32 is the CPU choice"


def _flash_sdpa() -> tuple[str, str]:
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        if not torch.backends.cuda.flash_sdp_enabled():
            return "off", "torch.backends.cuda.flash_sdp_enabled() is False"
        if (major, minor) < (8, 0):
            return "no", f"flash attention needs sm_80+, this GPU is sm_{major}{minor} (memory-efficient SDPA runs)"
        return "yes", f"sm_{major}{minor}, fp16/bf16 inputs"
    return "CPU kernel", "no CUDA: SDPA's CPU kernels (flash-style for fp32/bf16) run"


def _torch_compile() -> tuple[str, str]:
    from dsrecipes.distributed.torch_compile import cpp_compiler  # the lookup compile=... is validated with

    compiler = cpp_compiler()
    if torch.cuda.is_available():
        ok = importlib.util.find_spec("triton") is not None
        return ("yes" if ok else "no"), "inductor on the GPU needs triton" + ("" if ok else " (not installed)")
    if compiler:
        return "yes (CPU)", f"inductor's C++ backend with {compiler}"
    return "no", "inductor on CPU needs a C++ compiler (none on PATH)"


FEATURES: dict[str, Callable[[], tuple[str, str]]] = {
    "NCCL backend": lambda: _backend("NCCL", torch.distributed.is_nccl_available, needs_cuda=True),
    "gloo backend": lambda: _backend("gloo", torch.distributed.is_gloo_available, needs_cuda=False),
    "Triton kernels": _triton,
    "fused AdamW": _fused_optimizers,
    "CUDA graphs": _cuda_graphs,
    "bf16": _bf16,
    "fp16": _fp16,
    "flash SDPA": _flash_sdpa,
    "torch.compile": _torch_compile,
}


def features() -> dict[str, dict[str, str]]:
    """{feature: {"status": ..., "note": ...}}; a probe that raises gets status "error: ..."."""
    out = {}
    for name, probe in FEATURES.items():
        result = guarded(probe)
        status, note = (result, "") if isinstance(result, str) else result
        out[name] = {"status": status, "note": note}
    return out


def collect() -> dict[str, Any]:
    """The whole report as plain data: versions, devices, features."""
    return {"versions": versions(), "devices": devices(), "features": features()}


def _style(value: Any) -> str:
    from rich.markup import escape

    text = escape(str(value))
    if text.startswith("error:"):
        return f"[red]{text}[/red]"
    if text.startswith(NOT_INSTALLED) or text in ("no", "off"):
        return f"[dim]{text}[/dim]"
    return text


def tables(report: dict[str, Any]) -> list:
    """The report as rich tables: versions, devices, features."""
    from rich.table import Table

    versions_table = Table(title="dsrecipes report: versions")
    versions_table.add_column("package")
    versions_table.add_column("version", overflow="fold")
    for name, value in report["versions"].items():
        versions_table.add_row(name, _style(value))

    devices_table = Table(title="devices")
    devices_table.add_column("device")
    devices_table.add_column("what")
    devices_table.add_column("value", overflow="fold")
    for key, value in report["devices"]["cpu"].items():
        devices_table.add_row("cpu", key, _style(value))
    count = report["devices"]["cuda_device_count"]
    devices_table.add_row("cuda", "devices", _style(count))
    for index, gpu in enumerate(report["devices"]["cuda"]):
        if isinstance(gpu, str):  # the probe failed
            devices_table.add_row(f"cuda:{index}", "properties", _style(gpu))
            continue
        for key, value in gpu.items():
            devices_table.add_row(f"cuda:{index}", key, _style(value))

    features_table = Table(title="features")
    features_table.add_column("feature")
    features_table.add_column("can run here")
    features_table.add_column("note", overflow="fold")
    for name, result in report["features"].items():
        features_table.add_row(name, _style(result["status"]), _style(result["note"]))
    return [versions_table, devices_table, features_table]


def main(argv: list[str] | None = None) -> int:
    """Print the report (rich tables, or JSON with --json); returns the exit status (0)."""
    parser = argparse.ArgumentParser(prog="python -m dsrecipes report",
                                     description="Versions, devices and the features that can run on this machine.")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    args = parser.parse_args(argv)
    report = collect()
    if args.json:
        print(json.dumps(report, indent=2, default=str))
        return 0
    from dsrecipes.utils.console import make_console, print_table

    console = make_console()
    for table in tables(report):
        print_table(console, table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
