"""LoRA (dsrecipes.peft): wrapping, freezing, merging, and the PEFT adapter files, with the `peft` package as oracle.

In: apply_lora on dsrecipes' GPT and on a transformers LlamaForCausalLM starts from the base model's logits exactly,
trains only the adapters (biases as PEFT's bias option says: the trainable set is PEFT's own), and merges back to a
plain model with the same logits. Out: an adapter written by write_peft_adapter loads with
peft.PeftModel.from_pretrained onto the Hugging Face base (a dsrecipes GPT's export, kv_proj split into k_proj and
v_proj; a transformers module's own names) and gives dsrecipes' logits.
"""

from __future__ import annotations

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from dsrecipes.models.config import ModelConfig  # noqa: E402
from dsrecipes.models.gpt import GPT  # noqa: E402
from dsrecipes.models.hf_export import export_model  # noqa: E402
from dsrecipes.models.hf_module import HFCausalLM  # noqa: E402
from dsrecipes.peft import (  # noqa: E402
    LoRALinear,
    PeftConfig,
    add_base_layer_names,
    apply_lora,
    count_trainable,
    init_lora,
    lora_state_dict,
    merge_lora_state,
    merged_state_dict,
    native_name_map,
    strip_base_layer_names,
    write_peft_adapter,
)
from dsrecipes.peft.lora import is_lora_key  # noqa: E402


def tiny_cfg(**overrides) -> ModelConfig:
    fields = dict(style="llama", n_layer=2, n_head=4, n_kv_head=2, d_model=64, vocab_size=100, max_seq_len=32,
                  bias=False)
    return ModelConfig(**{**fields, **overrides})


def lora_cfg(**overrides) -> PeftConfig:
    return PeftConfig(**{"method": "lora", "r": 4, "alpha": 8.0, "init_seed": 0, **overrides})


def ids(seed: int = 1, batch: int = 2, seq: int = 16) -> torch.Tensor:
    return torch.randint(0, 100, (batch, seq), generator=torch.Generator().manual_seed(seed))


def logits_of(model: torch.nn.Module, input_ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids).logits


def train(model: torch.nn.Module, steps: int = 3) -> None:
    """A few AdamW steps on random tokens (lr large enough that lora_B moves well away from zero)."""
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    for step in range(steps):
        batch = ids(seed=100 + step)
        logits = model(batch).logits
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch.roll(-1, dims=1).flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.eval()


@pytest.fixture(scope="module")
def base_gpt() -> GPT:
    torch.manual_seed(0)
    return GPT(tiny_cfg()).eval()


def test_a_fresh_adapter_computes_the_base_model_and_only_adapters_train(base_gpt):
    model = copy.deepcopy(base_gpt)
    wrapped = apply_lora(model, lora_cfg())
    per_block = ["attn.q_proj", "attn.kv_proj", "attn.out_proj", "mlp.gate", "mlp.up", "mlp.fc_out"]
    assert wrapped == [f"blocks.{i}.{name}" for i in range(2) for name in per_block]  # no lm_head, no embedding
    assert torch.equal(logits_of(model, ids()), logits_of(base_gpt, ids()))
    trainable = [name for name, p in model.named_parameters() if p.requires_grad]
    assert trainable and all(is_lora_key(name) for name in trainable)
    assert len(trainable) == 2 * len(wrapped)
    n_trainable, total = count_trainable(model)
    adapters = [m for m in model.modules() if isinstance(m, LoRALinear)]
    assert n_trainable == sum(4 * (m.in_features + m.out_features) for m in adapters)
    assert total == base_gpt.num_params() + n_trainable
    q = model.blocks[0].attn.q_proj
    assert q.weight is q.base_layer.weight and (q.in_features, q.out_features) == (64, 64)
    assert model.lm_head.weight is model.tok_emb.weight  # tied weights stay tied


def test_trained_adapters_merge_into_a_plain_gpt_with_the_same_logits(base_gpt):
    pcfg = lora_cfg(dropout=0.1)
    model = copy.deepcopy(base_gpt)
    apply_lora(model, pcfg)
    train(model)
    for name, tensor in base_gpt.state_dict().items():  # the base weights did not move
        assert torch.equal(strip_base_layer_names(model.state_dict())[name], tensor), name
    q = model.blocks[1].attn.kv_proj
    assert q.lora_B.weight.abs().max() > 0

    merged = merged_state_dict(model)
    assert merged.keys() == base_gpt.state_dict().keys()
    expected = q.base_layer.weight + q.lora_B.weight @ q.lora_A.weight * (pcfg.alpha / pcfg.r)
    torch.testing.assert_close(merged["blocks.1.attn.kv_proj.weight"], expected, rtol=0, atol=1e-6)
    gathered = merge_lora_state(model.state_dict(), pcfg.scaling)  # what a trainer merges from a gathered state
    assert all(torch.equal(gathered[name], tensor) for name, tensor in merged.items())

    plain = GPT(tiny_cfg()).eval()
    plain.load_state_dict(merged)
    lora_logits = logits_of(model, ids())
    torch.testing.assert_close(logits_of(plain, ids()), lora_logits, rtol=0, atol=1e-5)
    assert not torch.allclose(lora_logits, logits_of(base_gpt, ids()), atol=1e-3)  # training changed something


def test_the_lm_head_is_adapted_only_when_named_and_stays_tied(base_gpt):
    for targets in (["re:.*"], ["all-linear"]):
        assert "lm_head" not in apply_lora(copy.deepcopy(base_gpt), lora_cfg(target_modules=targets))
    model = copy.deepcopy(base_gpt)
    assert apply_lora(model, lora_cfg(target_modules=["lm_head"])) == ["lm_head"]
    assert model.lm_head.weight is model.tok_emb.weight and not model.tok_emb.weight.requires_grad
    regex = apply_lora(copy.deepcopy(base_gpt), lora_cfg(target_modules=[r"re:blocks\.1\.attn\..*_proj"]))
    assert regex == ["blocks.1.attn.q_proj", "blocks.1.attn.kv_proj", "blocks.1.attn.out_proj"]


def test_meta_built_adapters_initialise_after_to_empty_as_apply_lora_does(base_gpt):
    eager = copy.deepcopy(base_gpt)
    apply_lora(eager, lora_cfg(init_seed=7))
    with torch.device("meta"):
        model = GPT(tiny_cfg())
    wrapped = apply_lora(model, lora_cfg(init_seed=7))
    assert all(p.is_meta for name, p in model.named_parameters() if is_lora_key(name))
    model.to_empty(device="cpu")
    model.init_weights()  # the model's own init knows nothing of adapters (it draws lora_B too) ...
    init_lora(model, init_seed=7)  # ... so the adapters are initialised after it
    adapters = {name: t for name, t in model.state_dict().items() if is_lora_key(name)}
    assert adapters.keys() == {name for name in eager.state_dict() if is_lora_key(name)}
    assert all(torch.equal(t, eager.state_dict()[name]) for name, t in adapters.items())
    # a base checkpoint's names onto the wrapped model: only the adapters are missing
    result = model.load_state_dict(add_base_layer_names(base_gpt.state_dict(), wrapped), strict=False)
    assert not result.unexpected_keys and set(result.missing_keys) == adapters.keys()
    assert torch.equal(logits_of(model.eval(), ids()), logits_of(base_gpt, ids()))


# peft 0.22 warns when an adapted layer is tied (ensure_weight_tying); the embedding stays unadapted, as in dsrecipes
@pytest.mark.filterwarnings("ignore:Model has `tie_word_embeddings=True`:UserWarning")
@pytest.mark.parametrize("case", ["llama", "qwen2-biases-lm_head"])
def test_a_native_adapter_loads_in_peft_onto_the_exported_base_with_the_same_logits(tmp_path, case):
    if case == "llama":
        cfg, pcfg = tiny_cfg(), lora_cfg(dropout=0.1)
    else:  # biases on q/k/v only (exported as Qwen2), trained with the adapters; the tied LM head adapted too
        cfg = tiny_cfg(qkv_bias=True)
        pcfg = lora_cfg(bias="lora_only", target_modules=[*PeftConfig().target_modules, "lm_head"])
    torch.manual_seed(0)
    base = GPT(cfg).eval()
    export_model(base.state_dict(), cfg, tmp_path / "base")
    model = copy.deepcopy(base)
    apply_lora(model, pcfg)
    train(model)
    adapter = lora_state_dict(model)
    assert any(name.endswith("kv_proj.base_layer.bias") for name in adapter) == (pcfg.bias == "lora_only")
    write_peft_adapter(adapter, pcfg, tmp_path / "adapter", str(tmp_path / "base"), native_name_map(cfg))

    hf_base = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "base")
    assert type(hf_base).__name__ == ("LlamaForCausalLM" if case == "llama" else "Qwen2ForCausalLM")
    peft_model = peft.PeftModel.from_pretrained(hf_base, tmp_path / "adapter").eval()
    lora_logits = logits_of(model, ids())
    torch.testing.assert_close(logits_of(peft_model, ids()), lora_logits, rtol=0, atol=1e-5)
    assert not torch.allclose(lora_logits, logits_of(base, ids()), atol=1e-3)


def tiny_llama(seed: int = 0):
    config = transformers.LlamaConfig(vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                                      attention_bias=True, mlp_bias=True, tie_word_embeddings=False)
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(config).eval()


@pytest.mark.parametrize("bias", ["none", "all", "lora_only"])
def test_the_trainable_set_is_peft_own(bias):
    targets = ["q_proj", "v_proj", "down_proj"]
    reference = peft.get_peft_model(tiny_llama(), peft.LoraConfig(r=4, lora_alpha=8, target_modules=targets,
                                                                   bias=bias))
    expected = {name.removeprefix("base_model.model.").replace(".default", "")
                for name, p in reference.named_parameters() if p.requires_grad}
    model = tiny_llama()
    apply_lora(model, lora_cfg(target_modules=targets, bias=bias))
    assert {name for name, p in model.named_parameters() if p.requires_grad} == expected


@pytest.mark.parametrize("wrapper", [False, True], ids=["PreTrainedModel", "HFCausalLM"])
def test_an_hf_module_adapter_loads_in_peft_with_the_same_logits(tmp_path, wrapper):
    hf = tiny_llama()
    base_state = {name: t.clone() for name, t in hf.state_dict().items()}
    model = HFCausalLM(hf, ModelConfig()) if wrapper else hf
    pcfg = lora_cfg(target_modules=["q_proj", "v_proj", "down_proj"], bias="all")
    wrapped = apply_lora(model, pcfg)
    assert len(wrapped) == 6 and all(name.startswith("hf." if wrapper else "model.") for name in wrapped)
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():  # trained stand-ins: random lora_B, shifted biases
        for name, p in model.named_parameters():
            if p.requires_grad and not name.endswith("lora_A.weight"):
                p.add_(torch.randn(p.shape, generator=generator) * 0.1)
    write_peft_adapter(lora_state_dict(model), pcfg, tmp_path, "tiny-llama")

    fresh = tiny_llama(seed=1)
    fresh.load_state_dict(base_state)
    peft_model = peft.PeftModel.from_pretrained(fresh, tmp_path).eval()
    assert peft_model.peft_config["default"].target_modules == {
        name.removeprefix("hf.") for name in wrapped}
    ours = logits_of(model.eval(), ids())
    torch.testing.assert_close(logits_of(peft_model, ids()), ours, rtol=0, atol=1e-5)
    assert not torch.allclose(ours, logits_of(tiny_llama(), ids()), atol=1e-3)


@pytest.mark.parametrize("overrides, key", [
    ({"r": 0}, "peft.r=0"), ({"method": "qlora"}, "peft.method='qlora'"), ({"bias": "some"}, "peft.bias='some'"),
    ({"alpha": 0.0}, "peft.alpha=0.0"), ({"dropout": 1.0}, "peft.dropout=1.0"),
    ({"target_modules": []}, "peft.target_modules=[]"), ({"method": "none"}, "peft.method='none'"),
    ({"target_modules": ["re:("]}, "peft.target_modules entry 're:('"),
])
def test_a_bad_setting_is_refused_naming_its_key(base_gpt, overrides, key):
    with pytest.raises(ValueError, match=r"^" + key.replace("[", r"\[").replace("(", r"\(")):
        apply_lora(copy.deepcopy(base_gpt), lora_cfg(**overrides))


def test_targets_matching_nothing_and_gpt2_adapters_are_refused(base_gpt):
    with pytest.raises(ValueError, match=r"peft.target_modules=\['foo'\] matched no nn.Linear of the model; its "
                                         r"Linear names end in: q_proj, kv_proj, out_proj, gate, up, fc_out, lm_head"):
        apply_lora(copy.deepcopy(base_gpt), lora_cfg(target_modules=["foo"]))
    with pytest.raises(ValueError, match="model.style=gpt2 .* export the merged weights"):
        native_name_map(tiny_cfg(style="gpt2", n_kv_head=None))
