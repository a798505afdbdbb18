"""Inference engine (dsrecipes.inference): KV-cache generation against full recomputation, batching with
left padding, sampling controls and seeds, stop tokens, streaming, and clear errors on bad input.

Tolerances: the cached path computes the same fp32 math as the model's forward, in a different
order (one query per step, masked SDPA), so logits agree to ~1e-5; 1e-4 absolute leaves margin.
"""

from __future__ import annotations

import io

import pytest
import torch

from dsrecipes.data.tokenizers import ByteTokenizer
from dsrecipes.inference import SamplingParams, init_inference
from dsrecipes.inference.decoder import CachedDecoder
from dsrecipes.inference.generation import generate
from dsrecipes.inference.logits_processing import choose_next_tokens, filter_top_k, filter_top_p
from dsrecipes.models import GPT, ModelConfig
from tests.helpers.generation import no_cache_greedy

LOGIT_ATOL = 1e-4


def tiny(style: str = "gpt2", n_kv_head=None, seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    cfg = ModelConfig(style=style, n_layer=2, n_head=4, n_kv_head=n_kv_head, d_model=32, vocab_size=61, max_seq_len=48)
    return GPT(cfg).eval()


PROMPTS = [[3, 1, 4, 1, 5, 9, 2, 6], [5, 3], [8, 9, 7, 9, 3]]
MODELS = [("gpt2", None), ("llama", None), ("llama", 2)]


@pytest.mark.parametrize("style,kv", MODELS)
def test_kv_cache_greedy_equals_no_cache_recomputation(style, kv):
    model = tiny(style, kv)
    decoder = CachedDecoder(model)
    for prompt in PROMPTS:
        assert generate(decoder, [prompt], 20).tokens[0] == no_cache_greedy(model, prompt, 20)


@pytest.mark.parametrize("style,kv", MODELS)
def test_cached_logits_match_full_forward_at_every_step(style, kv):
    model = tiny(style, kv)
    decoder = CachedDecoder(model)
    ids = torch.tensor([[7, 1, 2, 3, 11, 13, 17, 19, 23, 29]])
    full = model(ids).logits
    cache = decoder.allocate_cache(1, ids.shape[1])
    prefill = decoder.forward(ids[:, :4], cache, all_logits=True)
    torch.testing.assert_close(prefill, full[:, :4], atol=LOGIT_ATOL, rtol=0)
    for t in range(4, ids.shape[1]):
        step = decoder.forward(ids[:, t:t + 1], cache)
        torch.testing.assert_close(step, full[:, t], atol=LOGIT_ATOL, rtol=0)
    assert cache.length == ids.shape[1]


@pytest.mark.parametrize("style,kv", MODELS)
def test_static_decode_step_equals_eager_decode(style, kv):
    """decode_static (what a CUDA graph captures: slot on the device, whole-capacity masked attention)
    gives the eager step's logits at every slot of a left-padded batch, and the same generations."""
    model = tiny(style, kv)
    eager, static = CachedDecoder(model), CachedDecoder(model, decode_mode="static")
    ids = torch.tensor([[0, 0, 7, 1, 2], [4, 9, 8, 6, 5]])
    caches = [d.allocate_cache(2, 12) for d in (eager, static)]
    for cache in caches:
        cache.reset(torch.tensor([2, 0]))
    for d, cache in zip((eager, static), caches):
        d.forward(ids, cache)
    for t in range(6):
        step = torch.tensor([[3 + t], [11 + t]])
        torch.testing.assert_close(static.decode(step, caches[1]), eager.decode(step, caches[0]), atol=LOGIT_ATOL, rtol=0)
    assert caches[0].length == caches[1].length == 11
    torch.testing.assert_close(caches[1].keys, caches[0].keys, atol=1e-6, rtol=0)
    assert generate(static, PROMPTS, 12).tokens == generate(eager, PROMPTS, 12).tokens


def test_cuda_graph_option_is_checked():
    with pytest.raises(ValueError, match="decode_mode='graph' is not valid; choose one of: eager, static, cuda_graph"):
        CachedDecoder(tiny(), decode_mode="graph")
    with pytest.raises(ValueError, match="enable_cuda_graph=true needs a CUDA device; the model is on cpu"):
        init_inference(tiny(), enable_cuda_graph=True)


@pytest.mark.parametrize("style,kv", MODELS)
def test_batched_left_padded_generation_equals_per_prompt(style, kv):
    model = tiny(style, kv)
    decoder = CachedDecoder(model)
    batched = generate(decoder, PROMPTS, 16).tokens
    assert batched == [generate(decoder, [p], 16).tokens[0] for p in PROMPTS]
    # and the logits of each padded row equal the row alone
    ids = torch.tensor([[0, 0, 0, 5, 3, 8]])
    cache = decoder.allocate_cache(1, 6)
    cache.reset(torch.tensor([3]))
    alone_cache = decoder.allocate_cache(1, 3)
    torch.testing.assert_close(decoder.forward(ids, cache), decoder.forward(ids[:, 3:], alone_cache), atol=LOGIT_ATOL, rtol=0)


def test_kv_cache_is_preallocated_and_reused():
    engine = init_inference(tiny(), max_out_tokens=48)
    engine.generate([[1, 2, 3]], max_new_tokens=10)
    assert engine._cache.keys.shape[3] == 48  # capacity allocated up front, not grown per token
    engine.generate([[4, 5], [6, 7, 8]], max_new_tokens=12)  # a bigger batch: allocated once more
    pointer = engine._cache.keys.data_ptr()
    writes = []
    original = engine.decoder.allocate_cache
    engine.decoder.allocate_cache = lambda *a: writes.append(a) or original(*a)
    engine.generate([[9]], max_new_tokens=5)
    engine.generate([[1, 2], [3]], max_new_tokens=20)
    assert writes == [] and engine._cache.keys.data_ptr() == pointer
    assert engine._cache.batch == 2 and engine._cache.keys.shape[3] == 48


def test_sampling_is_reproducible_with_a_seed_and_varies_without():
    engine = init_inference(tiny())
    kwargs = dict(max_new_tokens=24, temperature=1.0, top_k=20, top_p=0.9)
    a = engine.generate(PROMPTS, seed=7, **kwargs).tokens
    b = engine.generate(PROMPTS, seed=7, **kwargs).tokens
    c = engine.generate(PROMPTS, seed=8, **kwargs).tokens
    assert a == b
    assert a != c


def test_top_k_top_p_and_repetition_penalty_semantics():
    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0, -3.0]])
    assert torch.isinf(filter_top_k(logits, 2)[0, 2:]).all() and torch.isfinite(filter_top_k(logits, 2)[0, :2]).all()
    probs = logits.softmax(-1)[0]  # ~[0.61, 0.22, 0.14, 0.03, 0.004]
    kept = torch.isfinite(filter_top_p(logits, 0.7))[0].tolist()
    assert kept == [True, True, False, False, False] and probs[0] < 0.7 <= probs[:2].sum()
    assert torch.isfinite(filter_top_p(logits, 0.01))[0].tolist() == [True, False, False, False, False]
    seen = torch.tensor([[True, False, False, True, False]])
    # greedy: token 0 (2.0) penalised to 2.0/4 = 0.5 < 1.0, so token 1 wins; negative logits get multiplied
    assert choose_next_tokens(logits, SamplingParams(repetition_penalty=4.0), seen).item() == 1
    gen = torch.Generator().manual_seed(0)
    draws = {choose_next_tokens(logits, SamplingParams(temperature=1.0, top_k=2), None, gen).item() for _ in range(200)}
    assert draws == {0, 1}


def test_repetition_penalty_changes_greedy_output_and_reduces_repeats():
    engine = init_inference(tiny(seed=3))
    plain = engine.generate(PROMPTS, max_new_tokens=30).tokens
    penalised = engine.generate(PROMPTS, max_new_tokens=30, repetition_penalty=3.0).tokens
    assert plain != penalised
    assert sum(len(t) - len(set(t)) for t in penalised) < sum(len(t) - len(set(t)) for t in plain)


def test_stop_tokens_end_each_row_independently():
    model = tiny()
    decoder = CachedDecoder(model)
    free = generate(decoder, PROMPTS, 12).tokens
    stop = free[0][4]  # the 5th token of row 0
    result = generate(decoder, PROMPTS, 12, stop_ids=[stop])
    for row, tokens in zip(free, result.tokens):
        expected = row[: row.index(stop)] if stop in row else row
        assert tokens == expected
    assert result.finish_reasons[0] == "stop"
    assert all(r == ("stop" if stop in row else "length") for r, row in zip(result.finish_reasons, free))


def test_streaming_callback_and_console_streamer():
    engine = init_inference(tiny(), tokenizer=None)
    seen = []
    out = engine.generate([[1, 2, 3]], max_new_tokens=6, on_token=lambda step, ids, fin: seen.append(int(ids[0])))
    assert seen == out.tokens[0]
    from dsrecipes.inference.engine import ConsoleStreamer

    class Letters:
        eos_id = None

        def encode(self, text):
            return [ord(c) - 96 for c in text]

        def decode(self, ids):
            return "".join(chr(96 + i) if 1 <= i <= 26 else "?" for i in ids)

    buf = io.StringIO()
    streamer = ConsoleStreamer(Letters(), 1, file=buf)
    result = generate(CachedDecoder(engine.model), [[1, 2]], 5, on_token=streamer)
    assert buf.getvalue() == Letters().decode(result.tokens[0])


def test_text_prompts_with_byte_tokenizer_and_eos_stop():
    torch.manual_seed(0)
    model = GPT(ModelConfig(n_layer=1, n_head=2, d_model=16, vocab_size=257, max_seq_len=32)).eval()
    engine = init_inference(model, tokenizer=ByteTokenizer())
    out = engine.generate(["ab", "hello"], max_new_tokens=5)
    assert out.texts == [ByteTokenizer().decode(t) for t in out.tokens]
    assert out.prompt_lengths == [2, 5]


def test_max_new_tokens_clamped_to_context_with_warning():
    engine = init_inference(tiny())
    with pytest.warns(UserWarning, match="does not fit the context"):
        out = engine.generate([[1] * 40], max_new_tokens=20)
    assert len(out.tokens[0]) == 8  # 48 - 40


@pytest.mark.parametrize("kwargs,message", [
    (dict(dtype="fp8"), "dtype='fp8' is not valid; choose one of: fp32, bf16, fp16, int8"),
    (dict(tensor_parallel=3), r"tensor_parallel.tp_size=3 does not divide model.n_head=4; valid sizes: \[1, 2, 4\]"),
    (dict(quant="int3"), "quant='int3' is not valid"),
    (dict(quant={"bits": 5}), "quant.bits=5 is not valid"),
])
def test_bad_engine_arguments_raise_clear_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        init_inference(tiny(), **kwargs)


def test_bad_prompts_raise_clear_errors():
    engine = init_inference(tiny())
    with pytest.raises(ValueError, match=r"prompt 1 has 49 tokens, longer than the model's context model.max_seq_len=48"):
        engine.generate([[1, 2], [1] * 49])
    with pytest.raises(ValueError, match="prompt 0 is empty"):
        engine.generate([[]])
    with pytest.raises(ValueError, match=r"outside \[0, 61\)"):
        engine.generate([[1, 99]])
    with pytest.raises(ValueError, match="text prompts need a tokenizer"):
        engine.generate("hi")
    with pytest.raises(ValueError, match="generate.top_p=0.0 must be in"):
        engine.generate([[1]], top_p=0.0)


def test_bf16_engine_runs_and_follows_fp32_greedy_start():
    fp32 = init_inference(tiny())
    bf16 = init_inference(tiny(), dtype="bf16")
    assert bf16.model.tok_emb.weight.dtype == torch.bfloat16
    ids = torch.tensor([PROMPTS[0]])
    torch.testing.assert_close(bf16.logits(ids).float(), fp32.logits(ids), atol=0.05, rtol=0)
