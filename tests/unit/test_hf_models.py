"""Any Hugging Face causal LM through the recipe (model=hf model.path=DIR), in one process: the model the Trainer
builds computes transformers' own loss for each of twelve architectures, whichever way it runs (dsrecipes' blocks
or the transformers module), its export loads back with from_pretrained, a sharded checkpoint loads bitwise as a
whole one, and what cannot run is refused before any work, one line naming the key.

    pytest tests/unit/test_hf_models.py

The checkpoints are tests/helpers/hf_models.py's (2 layers, width 64, seeded), made once per pytest run. The layouts
(ZeRO-3, tp, sp) are rows of the layout-equivalence table (tests/integration/equivalence/table.py).
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch

transformers = pytest.importorskip("transformers")

from dsrecipes.config import validate_recipe  # noqa: E402
from dsrecipes.config.store import compose  # noqa: E402
from dsrecipes.config.validate import parallel_dims  # noqa: E402
from dsrecipes.training.recipe_model import build_recipe_model  # noqa: E402
from dsrecipes.utils.errors import user_error_message  # noqa: E402
from tests.helpers.hf_models import ARCHITECTURES, NATIVE, make_checkpoint, tiny_checkpoint  # noqa: E402

CPU = torch.device("cpu")


def recipe(path, *overrides: str, world: int = 1):
    """The validated recipe of `model=hf model.path=PATH` (no dropout)."""
    root, _ = validate_recipe(compose(["model=hf", f"model.path={path}", "model.dropout=0.0", *overrides]),
                              dp_world_size=world)
    return root


def trainer_model(root):
    """The module the Trainer trains for `root` at world 1, its weights read from the checkpoint."""
    built = build_recipe_model(root.model, root.moe, parallel_dims(root, 1), root.parallel, CPU)
    if built.materialize is not None:
        built.materialize(built.module, CPU)
    return built


def token_batch(seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 257, (2, 33), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_the_trainers_model_computes_transformers_own_loss(arch, tmp_path_factory):
    path = tiny_checkpoint(tmp_path_factory, arch)
    built = trainer_model(recipe(path))
    assert built.description.startswith("native" if arch in NATIVE else "transformers")
    ids = token_batch()
    reference = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        theirs = reference(input_ids=ids, labels=ids)
        ours = built.module.eval()(ids[:, :-1], labels=ids[:, 1:])
    # the same model in fp32: measured 2026-12-07, loss within 9.5e-7 of transformers' (two float32 ulps at ~5.8: the
    # mean's summation order) and logits within 2.4e-7 (gpt2; the others bitwise); the bounds leave 2x room
    torch.testing.assert_close(ours.loss, theirs.loss, rtol=0, atol=2e-6)
    torch.testing.assert_close(ours.logits, theirs.logits[:, :-1], rtol=0, atol=2e-5)


@pytest.mark.parametrize("arch", ["gemma3", "phi3", "qwen3"])
def test_the_export_loads_back_with_from_pretrained_with_the_same_logits(arch, tmp_path_factory, tmp_path):
    from dsrecipes.models.hf_export import export_model
    from dsrecipes.models.hf_module_export import export_transformers

    root = recipe(tiny_checkpoint(tmp_path_factory, arch))
    built = trainer_model(root)
    with torch.no_grad():  # moved off the checkpoint: the export carries the trained weights, not model.path's
        for param in built.module.parameters():
            param.mul_(1.01)
    state = built.module.state_dict()
    if root.model.runs_transformers:
        export_transformers(state, root.model, tmp_path, tokenizer=root.data.tokenizer)
    else:
        export_model(state, root.model, tmp_path)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    ids = token_batch(1)
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, built.module.eval()(ids).logits, rtol=0, atol=1e-5)
    again = trainer_model(recipe(tmp_path))  # and it is a model.path again
    assert again.description == built.description


def test_a_sharded_checkpoint_loads_bitwise_as_the_whole_one(tmp_path_factory, tmp_path):
    whole = tiny_checkpoint(tmp_path_factory, "gemma3")
    model = transformers.AutoModelForCausalLM.from_pretrained(whole, dtype=torch.float32)
    model.save_pretrained(tmp_path, max_shard_size="40KB")
    shutil.copy(whole / "tokenizer.json", tmp_path)
    assert len(list(tmp_path.glob("model-*.safetensors"))) > 3 and (tmp_path / "model.safetensors.index.json").is_file()
    from_shards, from_whole = trainer_model(recipe(tmp_path)).module, trainer_model(recipe(whole)).module
    for (name, a), (_, b) in zip(from_shards.state_dict().items(), from_whole.state_dict().items(), strict=True):
        assert torch.equal(a, b), name


def test_an_moe_checkpoint_keeps_its_own_experts_and_router_loss(tmp_path_factory):
    root = recipe(tiny_checkpoint(tmp_path_factory, "qwen3_moe"))
    model = trainer_model(root).module
    total, active = model.num_params(), model.num_active_params()
    assert active < total  # 2 of 4 experts per token
    assert any(".experts." in name for name, _ in model.named_parameters())


# ------------------------------------------------------------------------------------------------- refusals
def refusal(*overrides: str, path, world: int = 1) -> str:
    with pytest.raises(ValueError) as error:
        recipe(path, *overrides, world=world)
    line = user_error_message(error.value)
    assert "\n" not in line
    return line


def copy_of(tmp_path_factory, tmp_path, arch: str):
    target = tmp_path / arch
    shutil.copytree(tiny_checkpoint(tmp_path_factory, arch), target)
    return target


def edit_config(path, **changes) -> None:
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, **changes}))


def test_remote_code_runs_only_when_allowed(tmp_path_factory, tmp_path):
    path = copy_of(tmp_path_factory, tmp_path, "gemma3")
    edit_config(path, auto_map={"AutoModelForCausalLM": "modeling_mine.MineForCausalLM"})
    line = refusal(path=path)
    assert "auto_map" in line and "model.trust_remote_code=true" in line


def test_a_missing_or_misshapen_tensor_is_named_before_any_work(tmp_path_factory, tmp_path):
    from safetensors.torch import load_file, save_file

    for arch in ("gemma3", "qwen3"):  # the transformers path and dsrecipes' blocks
        path = copy_of(tmp_path_factory, tmp_path, arch)
        state = load_file(path / "model.safetensors")
        name = next(n for n in state if n.endswith("mlp.down_proj.weight"))
        save_file({k: v for k, v in state.items() if k != name}, path / "model.safetensors", metadata={"format": "pt"})
        assert name in refusal(path=path)
        state[name] = state[name][:, :-1].contiguous()
        save_file(state, path / "model.safetensors", metadata={"format": "pt"})
        line = refusal(path=path)
        assert name in line and "shape" in line


def test_a_tokenizer_larger_than_the_vocabulary_is_refused(tmp_path_factory, tmp_path):
    path = tmp_path / "small_vocab"
    make_checkpoint("phi3", path)
    edit_config(path, vocab_size=200)  # the byte tokenizer has 257 ids
    line = refusal(path=path)
    assert "257 token ids" in line and "model.vocab_size" in line


def test_tp_and_sp_sizes_that_do_not_divide_the_model_are_refused(tmp_path_factory):
    path = tiny_checkpoint(tmp_path_factory, "gemma3")  # 4 query heads, 2 key/value heads
    assert "parallel.tp=4" in refusal("parallel.tp=4", "launcher.nproc_per_node=4", path=path, world=4)
    assert "parallel.sp=3" in refusal("parallel.sp=3", "launcher.nproc_per_node=3", path=path, world=3)


def test_without_transformers_the_transformers_path_names_the_extra(tmp_path_factory, monkeypatch):
    from dsrecipes.models import hf_module

    path = tiny_checkpoint(tmp_path_factory, "gemma3")
    monkeypatch.setattr(hf_module, "transformers_available", lambda: False)
    line = refusal(path=path)
    assert "dsrecipes[hf]" in line and "model.path=" in line


def test_the_transformers_path_is_the_choice_for_an_architecture_forced_onto_it(tmp_path_factory):
    path = tiny_checkpoint(tmp_path_factory, "qwen3")
    built = trainer_model(recipe(path, "model.impl=transformers"))
    assert built.description.startswith("transformers Qwen3ForCausalLM")
    line = refusal("model.impl=native", path=tiny_checkpoint(tmp_path_factory, "gemma3"))
    assert "model.impl=native" in line and "gemma3" in line


def test_mode_generate_decodes_a_transformers_checkpoint_greedily_with_its_stop_token(tmp_path_factory):
    from dsrecipes.data.tokenizers import build_tokenizer
    from dsrecipes.inference_cli import rewrite_aliases, run_inference_mode

    path = tiny_checkpoint(tmp_path_factory, "olmo2")
    tokenizer = build_tokenizer(str(path / "tokenizer.json"))
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    prompts = ["Hi", "a longer prompt"]
    overrides = rewrite_aliases(["mode=generate", f"checkpoint={path}", "generate.max_new_tokens=6",
                                 "generate.stop_tokens=[]", f"generate.prompt={prompts[1]}"])
    records = run_inference_mode(compose(overrides), ".", overrides)["generations"]
    ids = torch.tensor([tokenizer.encode(prompts[1])])
    with torch.no_grad():  # greedy by hand: the argmax of each step's last logits
        for _ in range(6):
            ids = torch.cat([ids, model(input_ids=ids).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    expected = tokenizer.decode(ids[0, len(tokenizer.encode(prompts[1])):].tolist())
    assert records == [{"prompt": prompts[1], "completion": expected, "finish_reason": "length"}]

    from dsrecipes.inference.hf_generate import TransformersGenerator

    engine = TransformersGenerator(path, tokenizer, "fp32", CPU)
    first = int(ids[0, len(tokenizer.encode(prompts[1]))])
    out = engine.generate(prompts, max_new_tokens=6, stop_tokens=[first])  # left-padded batch; stops at once
    assert out.finish_reasons[1] == "stop" and out.tokens[1] == []
    for key in ("generate.quant=int8", "generate.kernel_inject=true"):
        with pytest.raises(ValueError, match=key.split("=")[0].replace(".", r"\.")):
            run_inference_mode(compose([*overrides, key]), ".", [*overrides, key])


def test_a_region_read_without_the_memory_map_is_the_slice_of_the_tensor(tmp_path):
    from safetensors.torch import save_file

    from dsrecipes.models.safetensors_regions import SafetensorsRegions

    tensors = {"w": torch.randn(7, 5), "b": torch.randn(3).to(torch.bfloat16), "c": torch.randn(4, 6, 2).half(),
               "s": torch.tensor(3.0)}
    save_file(tensors, tmp_path / "x.safetensors")
    regions = SafetensorsRegions(tmp_path / "x.safetensors")
    for name, region in (("w", (slice(2, 5), slice(1, 4))), ("w", (slice(0, 7), slice(0, 5))), ("b", (slice(1, 3),)),
                         ("c", (slice(1, 2), slice(0, 6), slice(1, 2))), ("s", ())):
        got = regions.read(name, region)
        assert got.dtype == tensors[name].dtype and torch.equal(got, tensors[name][region]), (name, region)
