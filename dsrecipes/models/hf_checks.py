"""Checks of a `model=hf model.path=DIR` recipe before any worker starts: one line naming the key each.

    check_checkpoint_recipe(root)        # ModelConfig.check calls it when model.path is set

What is refused, and where the message points:
* transformers missing for a transformers-path model (the hf extra), a model_type transformers does not know,
  a config.json that names its own modelling code while model.trust_remote_code=false;
* weights: no safetensors / bin files, a tensor the model expects that the checkpoint lacks, a shape that
  differs, tensors the architecture has no place for (read from the safetensors headers, no weights loaded);
* the tokenizer: more token ids than the model's vocabulary (model.vocab_size);
* sizes that do not divide: parallel.tp against the heads, kv heads and sharded widths of the model's own plan,
  parallel.sp against the heads and the attention windows (dsrecipes.distributed.hf_tensor_parallel,
  hf_sequence_parallel).
The groups that need dsrecipes' own blocks are the compatibility rows of ModelConfig (dsrecipes.models.config).
"""

from __future__ import annotations

from dsrecipes.models.hf_config import read_hf_config, resolve_checkpoint_dir


def _causal_lm_model_types() -> set[str]:
    """The model_types AutoModelForCausalLM builds a module for in the installed transformers."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def check_model_type(model_cfg, config: dict) -> None:
    """transformers must know the model_type, or be allowed to run the checkpoint's own code."""
    model_type = config.get("model_type")
    if config.get("auto_map") and not model_cfg.trust_remote_code:
        raise ValueError(f"model.path={model_cfg.path!r} (model_type {model_type!r}) names its own modelling code in "
                         "config.json (auto_map), which dsrecipes does not run unless model.trust_remote_code=true "
                         "(read that code first: it runs in every worker)")
    if not config.get("auto_map") and model_type not in _causal_lm_model_types():
        raise ValueError(f"model.path={model_cfg.path!r}: model_type {model_type!r} has no causal-LM module in the "
                         "installed transformers (AutoModelForCausalLM builds none for it: an encoder-only or "
                         "unknown architecture); upgrade transformers, or check config.json's model_type")


def tokenizer_vocab(tokenizer: str) -> int | None:
    """Token ids of a tokenizer.json (with its added tokens); None for dsrecipes' byte tokenizer."""
    if tokenizer == "byte":
        return None
    from dsrecipes.data.tokenizers import HFTokenizerFile

    return HFTokenizerFile(tokenizer).vocab_size


def check_vocab(model_cfg, data_tokenizer: str) -> None:
    """The checkpoint's embedding must have a row for every id its tokenizer gives."""
    from dsrecipes.models.hf_import import tokenizer_for_training

    tokenizer = tokenizer_for_training(model_cfg.path, data_tokenizer)
    ids = tokenizer_vocab(tokenizer) or 257
    if model_cfg.vocab_size is not None and ids > model_cfg.vocab_size:
        raise ValueError(f"model.path={model_cfg.path!r}: its tokenizer ({tokenizer}) has {ids} token ids but the "
                         f"model's vocabulary (model.vocab_size) has {model_cfg.vocab_size} rows; train with the "
                         "checkpoint's own tokenizer, or resize its embeddings first")


def check_native_weights(model_cfg) -> None:
    """Every tensor dsrecipes' blocks need is in the checkpoint with the shape they need (headers only)."""
    import torch

    from dsrecipes.models.gpt import GPT
    from dsrecipes.models.hf_import import weight_files
    from dsrecipes.models.hf_loading import SafetensorsReader
    from dsrecipes.models.hf_weights import to_hf_state

    directory = resolve_checkpoint_dir(model_cfg.path)
    if not weight_files(directory):
        raise ValueError(f"model.path={model_cfg.path!r} holds no weights (model.safetensors, its sharded index, or "
                         "pytorch_model.bin)")
    reader = SafetensorsReader(directory)
    try:
        if not reader.names():
            return  # pytorch_model.bin: checked as it loads
        with torch.device("meta"):
            expected = to_hf_state(GPT(model_cfg).state_dict(), model_cfg)
        names = reader.names()
        for name, tensor in expected.items():
            bare = name.split(".", 1)[1] if name.startswith(("model.", "transformer.")) else name
            stored = name if name in names else bare if bare in names else None  # GPT-2's may lack "transformer."
            if stored is None:
                if name.endswith(".bias"):
                    continue  # a missing bias loads as zeros
                raise ValueError(f"model.path={model_cfg.path!r}: the checkpoint has no tensor {name!r}; is it a "
                                 f"complete checkpoint of its model_type?")
            shape, wanted = reader.shapes[stored], tuple(tensor.shape)
            if name.endswith("wpe.weight") and shape[1:] == wanted[1:] and shape[0] >= wanted[0]:
                continue  # learned positions beyond model.max_seq_len are dropped on load
            if shape != wanted:
                raise ValueError(f"model.path={model_cfg.path!r}: tensor {stored} has shape {shape} in the checkpoint but "
                                 f"{wanted} in the model its config.json describes")
    finally:
        reader.close()


def check_checkpoint_recipe(root) -> None:
    """Every check of the module docstring for the recipe `root` (a RootConfig with model.path set)."""
    model_cfg = root.model
    directory = resolve_checkpoint_dir(model_cfg.path)
    config = read_hf_config(directory)
    if not model_cfg.runs_transformers:
        check_vocab(model_cfg, root.data.tokenizer)
        check_native_weights(model_cfg)
        return
    from dsrecipes.models.hf_module import require_transformers

    require_transformers(model_cfg)
    check_model_type(model_cfg, config)  # the architecture first: a tokenizer is no use to a model that cannot run
    check_vocab(model_cfg, root.data.tokenizer)
    from dsrecipes.models.hf_loading import check_transformers_checkpoint
    from dsrecipes.models.hf_module import build_hf_module

    module = build_hf_module(model_cfg)  # parameters on the meta device: no weights allocated

    check_transformers_checkpoint(module.hf, directory, str(model_cfg.path))
    tp, sp = root.parallel.tp, root.parallel.sp
    if tp > 1:
        from dsrecipes.distributed.hf_tensor_parallel import check_tp_plan

        check_tp_plan(module.hf, tp)
    if sp > 1:
        from dsrecipes.distributed.hf_sequence_parallel import check_hf_sequence_parallel

        check_hf_sequence_parallel(module.hf, sp, root.data.block_size)
