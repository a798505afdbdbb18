"""Write a LoRA adapter in PEFT's format: a directory `peft.PeftModel.from_pretrained(base, dir)` loads.

    write_peft_adapter(lora_state_dict(model), cfg, "adapter/", "base-model-dir")          # model.hf's names
    write_peft_adapter(lora_state_dict(gpt), cfg, "adapter/", "exported/", native_name_map(gpt.cfg))

    <dir>/adapter_config.json        peft_type LORA, task_type CAUSAL_LM, r, lora_alpha, lora_dropout, bias,
                                     target_modules (the adapted modules' Hugging Face names), base_model_name_or_path
    <dir>/adapter_model.safetensors  base_model.model.<hf module>.lora_A.weight / .lora_B.weight (+ the trained
                                     biases: <hf module>.base_layer.bias for an adapted module, <hf module>.bias else)

The adapter must name the Hugging Face modules of the base model it loads onto:
  * a transformers module (model.style=hf, wrapped as `module.hf`) already has them: "hf." is stripped
    (hf_module_adapter_state, the default name_map); a bare PreTrainedModel's names pass as they are;
  * dsrecipes' own llama-style GPT, exported as LlamaForCausalLM / Qwen2ForCausalLM (dsrecipes.models.hf_weights):
    native_llama_adapter_state renames the blocks and splits the fused kv_proj into k_proj and v_proj. Each of the
    two keeps the whole lora_A and takes its rows of lora_B, split as the weight's rows are split, which is exact:
    (B @ A)[rows] = B[rows] @ A.
  * a gpt2-style GPT exports as GPT2LMHeadModel, whose Conv1D c_attn fuses q, k and v (and repeats GQA's kv heads)
    in a way no single LoRA pair reproduces: refused; export the merged weights instead.

dsrecipes never imports the `peft` package; the files follow what peft 0.22 writes and reads.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Mapping
from pathlib import Path

import torch
from safetensors.torch import save_file

from dsrecipes.models.config import ModelConfig
from dsrecipes.models.hf_weights import _split_kv
from dsrecipes.peft.config import PeftConfig, validate_peft_config

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."
HF_MODULE_PREFIX = "hf."

NameMap = Callable[[Mapping[str, torch.Tensor]], dict]

# dsrecipes' llama-style block names -> Hugging Face Llama's (the fused kv_proj is split apart)
_NATIVE_LLAMA = {"attn.q_proj": "self_attn.q_proj", "attn.out_proj": "self_attn.o_proj",
                 "mlp.gate": "mlp.gate_proj", "mlp.up": "mlp.up_proj", "mlp.fc_out": "mlp.down_proj"}
_NATIVE_KEY = re.compile(r"^blocks\.(?P<layer>\d+)\.(?P<module>attn\.\w+|mlp\.\w+)\."
                         r"(?P<part>lora_A\.weight|lora_B\.weight|base_layer\.bias|bias)$")
_HEAD_KEY = re.compile(r"^lm_head\.(?P<part>lora_A\.weight|lora_B\.weight)$")
_ADAPTER_KEY = re.compile(r"^(?P<module>.+)\.(?P<part>lora_A\.weight|lora_B\.weight|base_layer\.bias|bias)$")


def hf_module_adapter_state(adapter_state: Mapping[str, torch.Tensor]) -> dict:
    """Mapping (a): a transformers module's adapter under its own names ("hf." of dsrecipes' wrapper stripped)."""
    return {key[len(HF_MODULE_PREFIX):] if key.startswith(HF_MODULE_PREFIX) else key: tensor
            for key, tensor in adapter_state.items()}


def _out_features(model_cfg: ModelConfig) -> dict[str, tuple[int, int]]:
    """(in, out) features of each native module the mapping knows."""
    d, ff, hd = model_cfg.d_model, model_cfg.ffn_dim, model_cfg.head_dim
    return {"attn.q_proj": (d, model_cfg.n_head * hd), "attn.kv_proj": (d, 2 * model_cfg.kv_heads * hd),
            "attn.out_proj": (model_cfg.n_head * hd, d), "mlp.gate": (d, ff), "mlp.up": (d, ff), "mlp.fc_out": (ff, d)}


def _check_native_style(model_cfg: ModelConfig) -> None:
    style = str(model_cfg.style)
    if style == "gpt2":
        raise ValueError("model.style=gpt2 exports as GPT2LMHeadModel, whose Conv1D c_attn fuses q, k and v: a PEFT "
                         "adapter cannot name its parts; export the merged weights instead (merged_state_dict, then "
                         "dsrecipes.models.hf_export.export_model), which works for every style")
    if style != "llama":
        raise ValueError(f"model.style={style}: native_llama_adapter_state maps dsrecipes' llama-style blocks; a "
                         "transformers module (model.style=hf) already has Hugging Face names (name_map=None)")


def native_llama_adapter_state(adapter_state: Mapping[str, torch.Tensor], model_cfg: ModelConfig) -> dict:
    """Mapping (b): a llama-style dsrecipes GPT's adapter under the names of its Hugging Face export
    (model.layers.{i}.self_attn.{q,k,v,o}_proj, mlp.{gate,up,down}_proj, lm_head), kv_proj split in two."""
    _check_native_style(model_cfg)
    shapes = _out_features(model_cfg)
    hf: dict[str, torch.Tensor] = {}
    for key, tensor in adapter_state.items():
        head = _HEAD_KEY.match(key)
        if head:
            hf[key] = tensor
            continue
        match = _NATIVE_KEY.match(key)
        if match is None or match["module"] not in shapes:
            raise ValueError(f"the adapter tensor {key!r} has no Hugging Face name: the llama export names "
                             f"blocks.N.{{{', '.join(shapes)}}} and lm_head only")
        module, part = match["module"], match["part"]
        _check_shape(key, tensor, part, shapes[module])
        base = f"model.layers.{match['layer']}."
        if module != "attn.kv_proj":
            hf[f"{base}{_NATIVE_LLAMA[module]}.{part}"] = tensor
            continue
        if part == "lora_A.weight":  # both halves read the same input through the same down-projection
            k, v = tensor, tensor.clone()
        else:
            k, v = _split_kv(tensor, model_cfg.kv_heads, model_cfg.head_dim)
        hf[f"{base}self_attn.k_proj.{part}"], hf[f"{base}self_attn.v_proj.{part}"] = k, v
    return hf


def _check_shape(key: str, tensor: torch.Tensor, part: str, in_out: tuple[int, int]) -> None:
    """A tensor whose shape is not the module's (an MoE router called mlp.gate, another config) is refused."""
    in_features, out_features = in_out
    if part == "lora_A.weight":
        ok = tensor.dim() == 2 and tensor.shape[1] == in_features
    elif part == "lora_B.weight":
        ok = tensor.dim() == 2 and tensor.shape[0] == out_features
    else:
        ok = tuple(tensor.shape) == (out_features,)
    if not ok:
        raise ValueError(f"the adapter tensor {key!r} has shape {tuple(tensor.shape)}, which the model config's "
                         f"{in_features} -> {out_features} projection does not have (a different model.* config, "
                         "or a layer the llama export does not hold, such as an MoE router)")


def native_name_map(model_cfg: ModelConfig) -> NameMap:
    """write_peft_adapter's name_map for a dsrecipes GPT of model_cfg (checked now: gpt2 style is refused)."""
    _check_native_style(model_cfg)
    return functools.partial(native_llama_adapter_state, model_cfg=model_cfg)


def _adapted_modules(hf_state: Mapping[str, torch.Tensor]) -> list[str]:
    modules = []
    for key in hf_state:
        match = _ADAPTER_KEY.match(key)
        if match is None:
            raise ValueError(f"the adapter tensor {key!r} is neither a lora_A / lora_B weight nor a bias")
        if match["part"] == "lora_A.weight":
            if f"{match['module']}.lora_B.weight" not in hf_state:
                raise ValueError(f"the adapter has {key!r} but no {match['module']}.lora_B.weight")
            modules.append(match["module"])
    if not modules:
        raise ValueError("the adapter state holds no lora_A weight: pass lora_state_dict(model) of a model that "
                         "apply_lora wrapped")
    return sorted(modules)


def _alpha(value: float) -> int | float:
    return int(value) if float(value).is_integer() else float(value)


def adapter_config(cfg: PeftConfig, target_modules: list[str], base_model_name_or_path: str | None) -> dict:
    """The adapter_config.json of PEFT's LoraConfig (the fields whose defaults would not do, and those a reader
    looks for); PEFT fills in the rest with its defaults."""
    return {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base_model_name_or_path,
        "revision": None, "inference_mode": True, "r": int(cfg.r), "lora_alpha": _alpha(cfg.alpha),
        "lora_dropout": float(cfg.dropout), "target_modules": target_modules, "exclude_modules": None,
        "bias": str(cfg.bias), "fan_in_fan_out": False, "init_lora_weights": True, "use_rslora": False,
        "use_dora": False, "lora_bias": False, "modules_to_save": None, "layers_to_transform": None,
        "layers_pattern": None, "rank_pattern": {}, "alpha_pattern": {},
    }


def write_peft_adapter(adapter_state: Mapping[str, torch.Tensor], cfg: PeftConfig, out_dir: str | Path,
                       base_model_name_or_path: str | None, name_map: NameMap | None = None,
                       target_modules: list[str] | None = None) -> Path:
    """Write adapter_config.json and adapter_model.safetensors (module docstring) to out_dir; returns out_dir.

    adapter_state: lora_state_dict(model) (full tensors: gather a sharded model's first). name_map: dsrecipes names
    -> Hugging Face names (None = hf_module_adapter_state; native_name_map(model_cfg) for a dsrecipes GPT).
    target_modules: the config's list; None = the adapted modules' full Hugging Face names, which PEFT matches
    exactly (a short suffix list would also adapt any same-named module the adapter does not hold).
    """
    validate_peft_config(cfg)
    if str(cfg.method) != "lora":
        raise ValueError(f"peft.method={cfg.method!r}: there is no adapter to write (set peft.method=lora)")
    hf_state = (name_map or hf_module_adapter_state)(adapter_state)
    modules = _adapted_modules(hf_state)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    # one storage per tensor (safetensors refuses shared ones), on the CPU, contiguous
    tensors = {PEFT_PREFIX + key: tensor.detach().to("cpu").contiguous().clone() for key, tensor in hf_state.items()}
    save_file(tensors, str(out_dir / ADAPTER_WEIGHTS), metadata={"format": "pt"})
    config = adapter_config(cfg, list(target_modules) if target_modules is not None else modules,
                            base_model_name_or_path)
    (out_dir / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2))
    return out_dir
