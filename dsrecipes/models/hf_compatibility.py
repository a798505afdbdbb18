"""How a Hugging Face module (model.style=hf, the transformers path) composes with the other groups: the
compatibility rows of the model group (dsrecipes.config.compatibility gathers them).

What needs dsrecipes' own blocks is refused for such a model by name, before any worker starts: kernel injection
(its Triton modules replace dsrecipes' norms, MLPs and attention), compression (its masks and quantizers name the
GPT's linears), random-LTD (it drops tokens between dsrecipes' blocks), dsrecipes' MoE layers and expert
parallelism (a Hugging Face MoE model trains with its own experts, replicated or ZeRO-sharded), block-sparse
attention, and pipeline parallelism (the module has no stage split here yet). model.impl=native runs an
architecture dsrecipes' blocks compute (gpt2, llama, mistral, qwen2, qwen3) with all of them.
"""

from __future__ import annotations

from dsrecipes.utils.compatibility_rows import Refusal, Supported

NATIVE_HINT = "it needs dsrecipes' own blocks; model.impl=native runs gpt2 / llama / mistral / qwen2 / qwen3 checkpoints on them"


def _hf(root) -> bool:
    return str(root.model.style) == "hf"


def _refusal(key: str, value, why: str) -> str:
    return f"{key}={value} with model.style=hf (the transformers module of model.path): {why}; {NATIVE_HINT}"


def _kernels(root, dims):
    if _hf(root) and str(root.kernels.backend) == "triton":
        return _refusal("kernels.backend", "triton", "kernel injection swaps dsrecipes' norms, MLPs and attention")
    return None


def _compression(root, dims):
    from dsrecipes.compression.config import compression_enabled

    enabled = compression_enabled(root) if _hf(root) else []
    if enabled:
        return _refusal(f"compression.{enabled[0]}.enabled", "true", "its masks and quantizers name dsrecipes' linears")
    return None


def _random_ltd(root, dims):
    if _hf(root) and root.data_efficiency.random_ltd.enabled:
        return _refusal("data_efficiency.random_ltd.enabled", "true", "token dropping runs between dsrecipes' blocks")
    return None


def _moe(root, dims):
    if _hf(root) and root.moe.num_experts:
        return _refusal("moe.num_experts", root.moe.num_experts, "dsrecipes' MoE layers are its own blocks (a Hugging "
                        "Face MoE model trains with its own experts: keep moe=none)")
    if _hf(root) and dims.ep > 1:
        return _refusal("moe.ep_size", dims.ep, "expert parallelism places dsrecipes' MoE layers (a Hugging Face MoE "
                        "model's experts are replicated or ZeRO-sharded)")
    return None


def _sparse_attention(root, dims):
    if _hf(root) and str(root.sparse_attention.mode) != "none":
        return _refusal("sparse_attention.mode", root.sparse_attention.mode, "it routes dsrecipes' attention modules")
    return None


def _pipeline(root, dims):
    if _hf(root) and dims.pp > 1:
        return _refusal("parallel.pp", dims.pp, "the transformers module has no pipeline stage split in dsrecipes yet "
                        "(use zero.stage=3 and parallel.tp to spread it)")
    return None


HF_MODULE_ROWS: tuple[Refusal | Supported, ...] = (
    Refusal("model.style=hf with kernels.backend=triton", "kernel injection swaps dsrecipes' own modules", _kernels),
    Refusal("model.style=hf with compression", "masks and quantizers name dsrecipes' linears", _compression),
    Refusal("model.style=hf with random-LTD", "token dropping runs between dsrecipes' blocks", _random_ltd),
    Refusal("model.style=hf with the moe group or moe.ep_size > 1", "dsrecipes' MoE layers are its own blocks",
            _moe),
    Refusal("model.style=hf with sparse_attention", "routes dsrecipes' attention modules", _sparse_attention),
    Refusal("model.style=hf with pp", "not implemented yet (no stage split of a transformers module)", _pipeline),
    Supported("model.style=hf with ZeRO 0-3 and activation checkpointing", "supported: each decoder layer (the "
              "model's _no_split_modules class) one FSDP2 unit and one checkpointed block; resumes in one process",
              ("hf-gemma3-dp2-zero3-activation_checkpointing", "hf-mixtral-dp2-zero2")),
    Supported("model.style=hf with tp", "supported: the model's own base_model_tp_plan on DTensors, replicated "
              "activations", ("hf-gemma3-tp2",)),
    Supported("model.style=hf with sp", "supported: Ulysses all-to-alls around the model's attention function",
              ("hf-gemma3-sp2",)),
    Supported("model=hf on dsrecipes' blocks (model.impl=auto or native) with every layout", "supported: the "
              "checkpoint's weights in dsrecipes' GPT, every group and layout of the GPT", ("hf-qwen3-native-tp2",)),
)
