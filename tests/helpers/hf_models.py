"""Tiny random Hugging Face checkpoints of twelve architectures, made offline with save_pretrained, once per run.

    path = tiny_checkpoint(tmp_path_factory, "qwen3")            # a save_pretrained directory + a byte tokenizer
    overrides = resolve_checkpoints(["model=hf", "model.path=@hf:qwen3"], tmp_path_factory)

Each is 2 decoder layers of width 64 with 4 attention heads (2 key/value heads where the architecture has grouped
queries), a 320-row vocabulary over dsrecipes' byte tokenizer (written beside the weights: 257 ids, end of text
256), context 128, float32, seeded, so every test process of a run makes the same bytes. What each row stresses:
llama with grouped queries and Llama 3.1's rope scaling, qwen3 with its own head_dim and q/k norms, gemma3's
sandwich norms and scaled embeddings, phi3's fused projections, olmo2's post-norms, gpt_neox's parallel
residual, opt's learned positions, mixtral's and qwen3_moe's experts. The layout-equivalence table names them
as `model.path=@hf:ARCH` (resolved by tests/helpers/run_cache.py); the checkpoints live in the session's shared
temporary directory, made under a file lock by the first test process that asks.
"""

from __future__ import annotations

from pathlib import Path

from filelock import FileLock

PLACEHOLDER = "@hf:"
GROUPED = dict(vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=128, bos_token_id=256, eos_token_id=256,
               pad_token_id=None)


def _configs(transformers) -> dict:
    t = transformers
    return {
        "gpt2": lambda: t.GPT2Config(vocab_size=320, n_embd=64, n_layer=2, n_head=4, n_positions=128,
                                     bos_token_id=256, eos_token_id=256),
        "llama": lambda: t.LlamaConfig(**GROUPED, rope_parameters={
            "rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 32}),
        "mistral": lambda: t.MistralConfig(**GROUPED),
        "qwen2": lambda: t.Qwen2Config(**GROUPED),
        "qwen3": lambda: t.Qwen3Config(**GROUPED, head_dim=32),
        "gemma3": lambda: t.Gemma3TextConfig(**GROUPED, head_dim=16),
        "phi3": lambda: t.Phi3Config(**GROUPED),
        "olmo2": lambda: t.Olmo2Config(**GROUPED),
        "gpt_neox": lambda: t.GPTNeoXConfig(vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                            num_attention_heads=4, max_position_embeddings=128, bos_token_id=256,
                                            eos_token_id=256),
        "opt": lambda: t.OPTConfig(vocab_size=320, hidden_size=64, ffn_dim=128, num_hidden_layers=2,
                                   num_attention_heads=4, max_position_embeddings=128, word_embed_proj_dim=64,
                                   bos_token_id=256, eos_token_id=256, pad_token_id=None),
        "mixtral": lambda: t.MixtralConfig(**GROUPED, num_local_experts=4, num_experts_per_tok=2),
        "qwen3_moe": lambda: t.Qwen3MoeConfig(**GROUPED, num_experts=4, num_experts_per_tok=2,
                                              moe_intermediate_size=32, head_dim=16),
    }


ARCHITECTURES = ("gpt2", "llama", "mistral", "qwen2", "qwen3", "gemma3", "phi3", "olmo2", "gpt_neox", "opt",
                 "mixtral", "qwen3_moe")
NATIVE = ("gpt2", "llama", "mistral", "qwen2", "qwen3")  # dsrecipes' blocks compute these exactly (model.impl=auto)


def make_checkpoint(arch: str, path: Path, seed: int = 0) -> Path:
    """save_pretrained of a seeded random `arch` model at `path`, with dsrecipes' byte tokenizer beside it."""
    import torch
    import transformers

    from dsrecipes.models.hf_tokenizer import write_tokenizer_files

    config = _configs(transformers)[arch]()
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # weights larger than the 0.02 initialisation: the models differ visibly from uniform
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * 0.02)
    model.save_pretrained(path)
    write_tokenizer_files("byte", path, model_max_length=128)
    return path


def tiny_checkpoint(tmp_path_factory, arch: str) -> Path:
    """The run's checkpoint of `arch` (made by the first test process that asks)."""
    from tests.helpers.run_cache import shared_root

    root = shared_root(tmp_path_factory) / "hf_checkpoints"
    root.mkdir(exist_ok=True)
    path = root / arch
    with FileLock(str(root / f"{arch}.lock")):
        if not (path / "config.json").is_file():
            make_checkpoint(arch, path)
    return path


def resolve_checkpoints(overrides: list[str], tmp_path_factory) -> list[str]:
    """`key=@hf:ARCH` overrides with the path of the run's ARCH checkpoint."""
    out = []
    for override in overrides:
        key, sep, value = override.partition("=")
        if sep and value.startswith(PLACEHOLDER):
            value = str(tiny_checkpoint(tmp_path_factory, value.removeprefix(PLACEHOLDER)))
        out.append(f"{key}{sep}{value}")
    return out
