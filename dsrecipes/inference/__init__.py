"""Inference: text generation from trained models (DeepSpeed-Inference's `init_inference`).

    from dsrecipes.inference import init_inference, load_model
    model, source = load_model("outputs/<date>/<time>_gpt")       # run dir, checkpoint or export
    engine = init_inference(model, dtype="fp32", kernel_inject=False, quant=None, tensor_parallel=1)
    print(engine.generate("The ", max_new_tokens=40).tokens)

Modules: kv_cache (preallocated cache), decoder (prefill/decode forward over the cache), generation
(batched loop, stop tokens, streaming), logits_processing (temperature, top-k, top-p, repetition
penalty), decode_attention (Triton kernel), quantized (weight-only int8/int4), tensor_parallel,
loading (checkpoints and exports), engine (init_inference), config + cli (mode=generate /
serve-bench). The plain no-cache loop the trainer uses for its end-of-run sample is
dsrecipes.models.sampling. The names below are imported lazily, so the config schema can import inference.config alone.
"""

from __future__ import annotations

from dsrecipes.utils.lazy_exports import lazy_exports

_EXPORTS = {
    "InferenceEngine": "dsrecipes.inference.engine",
    "init_inference": "dsrecipes.inference.engine",
    "load_model": "dsrecipes.inference.loading",
    "SamplingParams": "dsrecipes.inference.logits_processing",
}

__all__ = sorted(_EXPORTS)


__getattr__ = lazy_exports(__name__, _EXPORTS)
