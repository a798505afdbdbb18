"""Hugging Face transformers interop both ways, on tiny random models built here (no download).

Out: a dsrecipes GPT exported (dsrecipes.models.hf_export) loads with AutoModelForCausalLM and gives the
same logits (gpt2 and llama styles, GQA, bias layouts), its tokenizer with AutoTokenizer, and back
with load_exported. In: transformers' GPT-2 / Llama / Mistral / Qwen2 checkpoints (save_pretrained)
import into dsrecipes' GPT with the same logits, fine-tune with the Trainer (model=hf) and generate
(mode=generate checkpoint=DIR). Bad input: an unsupported model_type is one line naming the supported ones.
"""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from dsrecipes.config import validate_recipe  # noqa: E402
from dsrecipes.config.store import compose  # noqa: E402
from dsrecipes.data.tokenizers import ByteTokenizer, build_tokenizer  # noqa: E402
from dsrecipes.inference import init_inference, load_model  # noqa: E402
from dsrecipes.inference_cli import rewrite_aliases, run_inference_mode  # noqa: E402
from dsrecipes.models import GPT, ModelConfig, load_exported  # noqa: E402
from dsrecipes.models.hf_export import export_model  # noqa: E402
from dsrecipes.models.hf_import import load_hf_checkpoint  # noqa: E402
from dsrecipes.models.hf_tokenizer import write_tokenizer_files  # noqa: E402
from dsrecipes.utils.errors import user_error_message  # noqa: E402

transformers.logging.set_verbosity_error()
VOCAB, SEQ = 320, 64
TEXT = "héllo wörld\n\tdef f(x): return x  # 😀"


def perturb(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Move every parameter off its init (norm weights off 1, biases off 0) so a misplaced tensor shows."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.05)
    return model.eval()


def ids(n: int = 24) -> torch.Tensor:
    return torch.randint(0, 257, (2, n), generator=torch.Generator().manual_seed(1))


# ------------------------------------------------------------------------------------------------ export
EXPORTS = {
    "gpt2": (ModelConfig(style="gpt2", n_layer=2, n_head=4, d_model=32), "GPT2LMHeadModel"),
    "gpt2_gqa_no_bias_untied": (ModelConfig(style="gpt2", n_layer=2, n_head=4, n_kv_head=2, d_model=32, bias=False,
                                            tie_embeddings=False), "GPT2LMHeadModel"),
    "llama_gqa": (ModelConfig(style="llama", n_layer=2, n_head=4, n_kv_head=2, d_model=32, bias=False,
                              rope_theta=500.0), "LlamaForCausalLM"),
    "llama_biases_untied": (ModelConfig(style="llama", n_layer=2, n_head=4, d_model=32, bias=True, qkv_bias=False,
                                        tie_embeddings=False), "LlamaForCausalLM"),
    "qwen2_style_qkv_bias": (ModelConfig(style="llama", n_layer=2, n_head=4, n_kv_head=1, d_model=32, bias=False,
                                         qkv_bias=True), "Qwen2ForCausalLM"),
}


@pytest.mark.parametrize("name", list(EXPORTS))
def test_export_loads_in_transformers_with_the_same_logits(tmp_path, name):
    cfg, architecture = EXPORTS[name]
    cfg.vocab_size, cfg.max_seq_len = VOCAB, SEQ
    torch.manual_seed(0)
    model = perturb(GPT(cfg))
    export_model(model.state_dict(), cfg, tmp_path / "export")

    hf, info = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "export", output_loading_info=True)
    assert type(hf).__name__ == architecture
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys"))
    with torch.no_grad():
        expected = model(ids()).logits
        torch.testing.assert_close(hf.eval()(ids()).logits, expected, rtol=0, atol=1e-5)
        back, config = load_exported(tmp_path / "export")  # dsrecipes reads the same directory, exactly
        assert back.cfg == cfg and config["tokenizer"] == "byte"
        torch.testing.assert_close(back(ids()).logits, expected, rtol=0, atol=0)


def test_export_writes_the_hf_files_and_a_byte_tokenizer_transformers_reads(tmp_path):
    cfg = ModelConfig(style="llama", n_layer=1, n_head=2, d_model=16, vocab_size=VOCAB, max_seq_len=SEQ)
    export_model(GPT(cfg).state_dict(), cfg, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == "llama" and config["architectures"] == ["LlamaForCausalLM"]
    assert (config["max_position_embeddings"], config["eos_token_id"], config["dsrecipes"]["tokenizer"]) == (SEQ, 256, "byte")
    assert json.loads((tmp_path / "generation_config.json").read_text())["eos_token_id"] == 256
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path)
    assert tok.encode(TEXT) == ByteTokenizer().encode(TEXT) and tok.decode(tok.encode(TEXT)) == TEXT
    assert tok.eos_token_id == ByteTokenizer.eos_id
    assert transformers.GenerationConfig.from_pretrained(tmp_path).eos_token_id == 256


def bpe_tokenizer(path) -> str:
    """A small byte-level BPE tokenizer.json trained here, with <|endoftext|>."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([TEXT, "hello world, the quick brown fox"] * 20, trainer)
    path.mkdir(parents=True, exist_ok=True)
    tok.save(str(path / "tokenizer.json"))
    return str(path / "tokenizer.json")


def test_export_copies_an_hf_tokenizer_in_and_records_it_relatively(tmp_path):
    spec = bpe_tokenizer(tmp_path / "tok")
    cfg = ModelConfig(style="gpt2", n_layer=1, n_head=2, d_model=16, vocab_size=VOCAB, max_seq_len=SEQ)
    export_model(GPT(cfg).state_dict(), cfg, tmp_path / "export", tokenizer=spec)
    config = json.loads((tmp_path / "export" / "config.json").read_text())
    assert config["dsrecipes"]["tokenizer"] == "tokenizer.json"  # relative: the directory moves as a whole
    ours = build_tokenizer(spec)
    assert config["eos_token_id"] == ours.eos_id
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "export")
    assert tok.encode(TEXT) == ours.encode(TEXT) and tok.eos_token == "<|endoftext|>"
    _, view = load_exported(tmp_path / "export")
    assert view["tokenizer"] == str((tmp_path / "export" / "tokenizer.json").resolve())


# ------------------------------------------------------------------------------------------------ import
def hf_checkpoint(path, kind: str, **overrides) -> tuple:
    """A tiny random transformers model of `kind`, perturbed, saved with save_pretrained plus a byte tokenizer.json."""
    common = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=SEQ, bos_token_id=256, eos_token_id=256)
    config = {
        "gpt2": lambda: transformers.GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=32, n_layer=2, n_head=4,
                                                bos_token_id=256, eos_token_id=256, **overrides),
        "llama": lambda: transformers.LlamaConfig(**{**common, "rope_theta": 1234.0, **overrides}),
        "mistral": lambda: transformers.MistralConfig(**{**common, **overrides}),
        "qwen2": lambda: transformers.Qwen2Config(**{**common, **overrides}),
    }[kind]()
    torch.manual_seed(0)
    model = perturb(transformers.AutoModelForCausalLM.from_config(config))
    model.save_pretrained(path, **({"max_shard_size": "40KB"} if kind == "mistral" else {}))  # mistral: sharded
    write_tokenizer_files("byte", path, SEQ)
    return path, model


@pytest.mark.parametrize("kind", ["gpt2", "llama", "mistral", "qwen2"])
def test_hf_checkpoint_imports_with_the_same_logits(tmp_path, kind):
    path, hf = hf_checkpoint(tmp_path / kind, kind)
    model, view = load_hf_checkpoint(path)
    assert isinstance(model, GPT) and view["hf"]["model_type"] == kind
    assert model.cfg.kv_heads == (4 if kind == "gpt2" else 2)
    assert model.cfg.attn_qkv_bias == (kind in ("gpt2", "qwen2"))
    assert view["tokenizer"] == str((path / "tokenizer.json").resolve())
    with torch.no_grad():
        torch.testing.assert_close(model(ids()).logits, hf(ids()).logits, rtol=0, atol=1e-5)


def test_generate_from_an_hf_directory_matches_transformers_greedy(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path, hf = hf_checkpoint(tmp_path / "llama", "llama")
    model, info = load_model(path)  # what mode=generate and serve-bench load
    assert info.kind == "export" and info.model_cfg.n_kv_head == 2
    tokenizer = build_tokenizer(info.tokenizer)
    engine = init_inference(model, tokenizer=tokenizer)
    out = engine.generate(["Hi"], max_new_tokens=6, stop_tokens=[])
    expected = torch.tensor([tokenizer.encode("Hi")])
    with torch.no_grad():
        for _ in range(6):  # transformers' own greedy continuation
            expected = torch.cat([expected, hf(expected).logits[:, -1:].argmax(-1)], dim=1)
    assert out.tokens[0] == expected[0, 2:].tolist()

    overrides = rewrite_aliases(["mode=generate", f"checkpoint={path}", "prompt=Hi", "generate.max_new_tokens=6",
                                 "generate.stop_tokens=[]"])
    records = run_inference_mode(compose(overrides), ".", overrides)["generations"]
    assert records[0]["completion"] == tokenizer.decode(out.tokens[0])


# ------------------------------------------------------------------------------------------------ bad input
def test_an_architecture_without_a_native_form_or_a_causal_lm_is_one_line_naming_model_type(tmp_path):
    config = transformers.BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=32)
    transformers.BertForMaskedLM(config).save_pretrained(tmp_path / "bert")
    with pytest.raises(ValueError) as error:  # the native loader names what it takes and where the rest runs
        load_hf_checkpoint(tmp_path / "bert")
    message = str(error.value)
    assert "\n" not in message and "'bert'" in message and "gpt2, llama, mistral, qwen2, qwen3" in message
    assert "model=hf" in message

    config = json.loads((tmp_path / "bert" / "config.json").read_text())
    (tmp_path / "bert" / "config.json").write_text(json.dumps({**config, "model_type": "encoder_only_thing"}))
    for impl, fragment in (("auto", "no causal-LM module"), ("native", "has no native form")):
        with pytest.raises(ValueError) as error:  # the recipe path: one line, before any work starts
            validate_recipe(compose(["model=hf", f"model.path={tmp_path / 'bert'}", f"model.impl={impl}"]),
                            dp_world_size=1)
        line = user_error_message(error.value)
        assert "\n" not in line and "'encoder_only_thing'" in line and fragment in line


def test_what_dsrecipes_blocks_cannot_compute_is_refused_naming_the_key(tmp_path):
    path, _ = hf_checkpoint(tmp_path / "gpt2", "gpt2", activation_function="relu")
    with pytest.raises(ValueError, match="activation_function='relu'.*gelu_new"):
        load_hf_checkpoint(path)
    config = json.loads((path / "config.json").read_text())
    config.update(model_type="llama", hidden_size=32, num_attention_heads=4, num_hidden_layers=2, intermediate_size=48,
                  rope_parameters={"rope_type": "yarn", "rope_theta": 5e5, "factor": 4.0})
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="rope_type='yarn'.*default, linear, llama3"):
        load_hf_checkpoint(path)


def test_an_moe_model_keeps_dsrecipes_layout_with_its_tokenizer_copied_in(tmp_path):
    from dsrecipes.models.moe_config import MoEConfig

    cfg = ModelConfig(n_layer=2, n_head=2, d_model=16, vocab_size=VOCAB, max_seq_len=SEQ)
    moe = MoEConfig(num_experts=4, k=2, drop_tokens=False)
    torch.manual_seed(0)
    model = GPT(cfg, moe).eval()
    export_model(model.state_dict(), cfg, tmp_path, tokenizer=bpe_tokenizer(tmp_path / "tok"), moe_cfg=moe)
    config = json.loads((tmp_path / "config.json").read_text())
    assert "model_type" not in config and config["moe"]["num_experts"] == 4 and config["tokenizer"] == "tokenizer.json"
    loaded, info = load_model(tmp_path)
    assert info.tokenizer == str((tmp_path / "tokenizer.json").resolve())
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids()).logits, model(ids()).logits)


def test_load_flavor_hf_reads_a_checkpoint_config(tmp_path):
    from dsrecipes.models import load_flavor

    path, _ = hf_checkpoint(tmp_path / "qwen2", "qwen2")
    cfg = load_flavor("hf", path=str(path), dropout=0.1)
    assert (cfg.style, cfg.n_kv_head, cfg.bias, cfg.qkv_bias, cfg.dropout) == ("llama", 2, False, True, 0.1)
