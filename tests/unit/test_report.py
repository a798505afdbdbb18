"""`python -m dsrecipes report`: runs here (no CUDA), shows CUDA rows when CUDA is there, and a probe that raises
shows an error cell instead of a traceback."""

import importlib.metadata
import json
from types import SimpleNamespace

import torch

from dsrecipes import report


def _render(capsys, argv=()) -> str:
    assert report.main(list(argv)) == 0
    return capsys.readouterr().out


def test_report_on_this_cpu_machine(capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = _render(capsys, ["--json"])
    data = json.loads(out)
    assert data["versions"]["torch"] == importlib.metadata.version("torch")
    assert data["versions"]["hydra-core"][0].isdigit() and data["versions"]["omegaconf"][0].isdigit()
    assert data["devices"]["cuda_device_count"] == 0 and data["devices"]["cuda"] == []
    assert data["devices"]["cpu"]["cores"] >= 1 and data["devices"]["cpu"]["RAM GiB"] > 0
    features = data["features"]
    assert features["gloo backend"]["status"] == "yes"
    assert features["NCCL backend"]["status"] == "no"
    assert features["CUDA graphs"]["status"] == "no"
    assert not any(str(f["status"]).startswith("error") for f in features.values())
    text = _render(capsys)
    for title in ("dsrecipes report: versions", "devices", "features", "gloo backend", "bf16"):
        assert title in text


class _Props(SimpleNamespace):
    pass


def test_report_shows_cuda_devices_when_cuda_is_there(capsys, monkeypatch):
    props = [_Props(name="NVIDIA H100 80GB HBM3", major=9, minor=0, total_memory=80 * 2**30, multi_processor_count=132),
             _Props(name="NVIDIA A10", major=8, minor=6, total_memory=24 * 2**30, multi_processor_count=72)]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props[i])
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=None: (9, 0))
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    monkeypatch.setattr(torch.cuda.nccl, "version", lambda: (2, 21, 5))
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    monkeypatch.setattr(torch.distributed, "is_nccl_available", lambda: True)
    monkeypatch.setattr(report, "_fused_adamw_on", lambda device: True)  # a real CUDA step cannot run here
    data = json.loads(_render(capsys, ["--json"]))
    assert data["versions"]["torch CUDA build"] == "12.4" and data["versions"]["NCCL"] == "2.21.5"
    assert data["devices"]["cuda_device_count"] == 2
    assert data["devices"]["cuda"][0] == {"name": "NVIDIA H100 80GB HBM3", "capability": "sm_90", "memory_gib": 80.0,
                                          "multiprocessors": 132}
    assert data["devices"]["cuda"][1]["capability"] == "sm_86"
    features = data["features"]
    assert features["NCCL backend"]["status"] == "yes"
    assert features["bf16"]["status"] == "yes"
    assert features["CUDA graphs"]["status"] == "yes"
    assert features["fused AdamW"]["status"] == "yes (cuda, cpu)"
    assert features["flash SDPA"]["status"] == "yes"
    text = _render(capsys)
    assert "cuda:0" in text and "NVIDIA H100 80GB HBM3" in text and "cuda:1" in text and "sm_86" in text


def test_a_probe_that_raises_shows_an_error_cell(capsys, monkeypatch):
    def broken(index=None):
        raise RuntimeError("CUDA driver initialization failed")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_properties", broken)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("no driver")))
    monkeypatch.setattr(torch.cuda, "get_device_capability", broken)
    monkeypatch.setattr(report, "_fused_adamw_on", lambda device: True)
    data = json.loads(_render(capsys, ["--json"]))
    assert data["devices"]["cuda"] == ["error: RuntimeError: CUDA driver initialization failed"]
    assert data["features"]["bf16"]["status"] == "error: RuntimeError: no driver"
    assert data["features"]["flash SDPA"]["status"].startswith("error: RuntimeError")
    text = _render(capsys)
    assert "error: RuntimeError: CUDA driver initialization failed" in text and "Traceback" not in text
