"""Instruction data: chat rendering against transformers, loss masks, packing that keeps documents apart, the
global-token loss mean, and the one-line refusals of bad data (dsrecipes.data.samples, sample_packing, sample_data,
chat_templates; dsrecipes.models.document_attention; dsrecipes.training.token_weights).

Measured on this CPU (torch 2.13, transformers 5.25): a packed row of three documents against the three run alone,
native llama / gpt2 blocks: loss differences <= 2.4e-7, gradients <= 3e-7; transformers Llama/Qwen3 modules: the same
order. The oracle for rendering is transformers' own apply_chat_template on a tokenizer built here (no download).
"""

from __future__ import annotations

import json

import pytest
import torch

from dsrecipes.data import DataConfig, prepare_data
from dsrecipes.data.chat_templates import BUILTIN_TEMPLATES, ChatTemplate, resolve_chat_template
from dsrecipes.data.config import validate_data_config
from dsrecipes.data.sample_packing import first_fit_decreasing
from dsrecipes.data.samples import SampleSpec, encode_sample
from dsrecipes.data.tokenizers import ByteTokenizer, HFTokenizerFile
from dsrecipes.models.config import ModelConfig
from dsrecipes.models.document_attention import document_causal_mask, document_ids
from dsrecipes.models.gpt import GPT
from dsrecipes.training.token_weights import token_weights

CONVERSATIONS = [
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2 plus 3?"},
     {"role": "assistant", "content": "2 plus 3 is 5."}],
    [{"role": "user", "content": "Spell 'über' backwards."}, {"role": "assistant", "content": "'rebü'."},
     {"role": "user", "content": "And 'pass'?"}, {"role": "assistant", "content": "'ssap'."}],
]
# ChatML with the assistant's part in {% generation %} (what transformers' return_assistant_tokens_mask reads):
# the content, the end-of-turn token and its newline, as the prefix rule of dsrecipes.data.chat_templates finds them
CHATML_GENERATION = (
    "{% for message in messages %}{% if message['role'] == 'assistant' %}{{ '<|im_start|>assistant\\n' }}"
    "{% generation %}{{ message['content'] + '<|im_end|>\\n' }}{% endgeneration %}"
    "{% else %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def chat_tokenizer(directory, template: str):
    """A small byte-level BPE tokenizer.json with ChatML's special tokens and `template` as its own chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=420, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    corpus = [m["content"] for conv in CONVERSATIONS for m in conv] * 20 + ["user assistant system"] * 20
    tok.train_from_iterator(corpus, trainer)
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>", "chat_template": template}))
    return directory / "tokenizer.json"


@pytest.fixture(scope="module")
def chatml_dir(tmp_path_factory):
    return chat_tokenizer(tmp_path_factory.mktemp("chatml"), CHATML_GENERATION).parent


# ------------------------------------------------------------------------------------------------ rendering
@pytest.mark.parametrize("template", ["chatml_generation", "llama3", "chatml"])
def test_rendered_chat_ids_equal_apply_chat_template(tmp_path, template):
    transformers = pytest.importorskip("transformers")
    text = CHATML_GENERATION if template == "chatml_generation" else BUILTIN_TEMPLATES[template]
    path = chat_tokenizer(tmp_path, text)
    cfg = DataConfig(format="chat", tokenizer=str(path))
    spec = SampleSpec("chat", "all", template=resolve_chat_template(cfg))
    tokenizer = HFTokenizerFile(str(path))
    reference = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    for messages in CONVERSATIONS:
        ids, targets = encode_sample({"messages": messages}, spec, tokenizer, tokenizer.eos_id)
        assert ids == list(reference.apply_chat_template(messages, tokenize=True, return_dict=True)["input_ids"])
        assert all(targets)


def test_assistant_tokens_are_exactly_transformers_assistant_mask(chatml_dir):
    """train_on=assistant flags the tokens transformers' return_assistant_tokens_mask flags, from the generation
    tags; the same template without the tags (located from prefix renderings) flags the very same tokens."""
    transformers = pytest.importorskip("transformers")
    reference = transformers.AutoTokenizer.from_pretrained(str(chatml_dir))
    tokenizer = HFTokenizerFile(str(chatml_dir / "tokenizer.json"))
    tagged = SampleSpec("chat", "assistant", template=resolve_chat_template(
        DataConfig(format="chat", tokenizer=str(chatml_dir / "tokenizer.json"))))
    untagged = SampleSpec("chat", "assistant", template=ChatTemplate("chatml", BUILTIN_TEMPLATES["chatml"]))
    for messages in CONVERSATIONS:
        out = reference.apply_chat_template(messages, tokenize=True, return_dict=True,
                                            return_assistant_tokens_mask=True)
        ids, targets = encode_sample({"messages": messages}, tagged, tokenizer, tokenizer.eos_id)
        assert ids == list(out["input_ids"]) and targets == list(out["assistant_masks"])
        assert encode_sample({"messages": messages}, untagged, tokenizer, tokenizer.eos_id) == (ids, targets)
        flagged = tokenizer.tokenizer.decode([i for i, t in zip(ids, targets) if t], skip_special_tokens=False)
        assert flagged == "".join(m["content"] + "<|im_end|>\n" for m in messages if m["role"] == "assistant")


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_train_on_assistant_labels_exactly_the_assistant_turns(tmp_path):
    """Through prepare_data (packing=none): the labelled tokens of each row are its assistant turns, nothing else."""
    rows = [{"messages": CONVERSATIONS[i % 2]} for i in range(40)]
    cfg = DataConfig(source="files", paths=[str(write_jsonl(tmp_path / "chat.jsonl", rows))], format="chat",
                     chat_template="plain", packing="none", block_size=96, cache_dir=str(tmp_path / "cache"))
    data = prepare_data(cfg)
    byte = ByteTokenizer()
    expected = {"".join(f"{m['content']}\n\n" for m in conv if m["role"] == "assistant") for conv in CONVERSATIONS}
    for row in data.train:
        assert byte.decode([t for t in row["labels"] if t != -100]) in expected
        labels = torch.tensor(row["labels"])
        assert int((labels != -100).sum()) < int((torch.tensor(row["input_ids"]) != byte.eos_id).sum())


def test_prompt_completion_labels_the_completion_and_eos(tmp_path):
    rows = [{"prompt": f"Q{i}: ", "completion": f"answer {i}"} for i in range(30)]
    cfg = DataConfig(source="files", paths=[str(write_jsonl(tmp_path / "pc.jsonl", rows))],
                     format="prompt_completion", packing="documents", block_size=64, cache_dir=str(tmp_path / "c"))
    data = prepare_data(cfg)
    byte = ByteTokenizer()
    for row in data.train:
        labels = [t for t in row["labels"] if t != -100]
        text = bytes(t for t in labels if t < 256).decode()
        assert labels.count(byte.eos_id) == sum(1 for p in row["position_ids"] if p == 0) - (row["labels"][-1] == -100)
        assert "Q" not in text and text.replace("answer ", "").replace(" ", "")
    with_all = prepare_data(DataConfig(**{**cfg.__dict__, "train_on": "all", "packing": "none"}))
    assert ": answer" in byte.decode([t for t in with_all.train[0]["labels"] if t != -100])  # the prompt too


# ------------------------------------------------------------------------------------------------ packing
def test_first_fit_decreasing_keeps_every_sample_once_within_capacity():
    lengths = [5, 9, 3, 7, 2, 8, 1, 6]
    bins = first_fit_decreasing(lengths, 10)
    assert sorted(i for b in bins for i in b) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in b) <= 10 for b in bins) and len(bins) == 5


def test_document_mask_blocks_and_restarts():
    positions = torch.tensor([[0, 1, 2, 0, 1, 0, 0, 1]])
    assert document_ids(positions).tolist() == [[0, 0, 0, 1, 1, 2, 3, 3]]
    mask = document_causal_mask(positions)[0, 0]
    assert mask[4].tolist() == [False, False, False, True, True, False, False, False]
    assert mask[2].tolist() == [True, True, True, False, False, False, False, False]


DOCS = [torch.tensor([5, 17, 30, 2, 9, 41, 3]), torch.tensor([8, 8, 21, 60, 4]), torch.tensor([12, 7, 33, 19])]


def packed_row(docs, block: int, pad: int = 0):
    """One row of `docs` as data.packing=documents lays it out: inputs, labels and positions, padding at the end."""
    ids = torch.cat([d[:-1] for d in docs])
    labels = torch.cat([d[1:] for d in docs])
    positions = torch.cat([torch.arange(len(d) - 1) for d in docs])
    fill = block - len(ids)
    return (torch.cat([ids, torch.full((fill,), pad)])[None], torch.cat([labels, torch.full((fill,), -100)])[None],
            torch.cat([positions, torch.arange(fill)])[None])


def alone_loss_and_grads(model, docs):
    """The token-mean loss of the documents run one by one, and its gradients."""
    model.zero_grad()
    total = sum(len(d) - 1 for d in docs)
    loss = sum(torch.nn.functional.cross_entropy(model(d[None, :-1]).logits[0], d[1:], reduction="sum")
               for d in docs) / total
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def packed_loss_and_grads(model, docs, block: int = 20):
    model.zero_grad()
    ids, labels, positions = packed_row(docs, block)
    loss = model(ids, labels=labels, position_ids=positions).loss
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def assert_same_loss_and_grads(model, docs) -> None:
    loss, grads = packed_loss_and_grads(model, docs)
    ref_loss, ref_grads = alone_loss_and_grads(model, docs)
    assert abs(float(loss - ref_loss)) <= 1e-6
    for name, grad in grads.items():
        assert torch.allclose(grad, ref_grads[name], atol=1e-6, rtol=0), name


@pytest.mark.parametrize("style", ["llama", "gpt2"])
def test_a_packed_row_gives_each_document_its_loss_and_gradients_alone(style):
    torch.manual_seed(0)
    model = GPT(ModelConfig(style=style, n_layer=2, n_head=4, n_kv_head=2 if style == "llama" else None, d_model=32,
                            vocab_size=64, max_seq_len=32, dropout=0.0))
    assert_same_loss_and_grads(model, DOCS)


def test_changing_one_document_leaves_the_others_logits_unchanged():
    torch.manual_seed(0)
    model = GPT(ModelConfig(style="llama", n_layer=2, n_head=4, d_model=32, vocab_size=64, max_seq_len=32))
    ids, _, positions = packed_row(DOCS, 20)
    changed = ids.clone()
    changed[0, :6] = torch.tensor([1, 2, 3, 4, 5, 6])  # document A (the first 6 inputs)
    with torch.no_grad():
        before, after = model(ids, position_ids=positions).logits, model(changed, position_ids=positions).logits
    assert torch.equal(before[0, 6:], after[0, 6:])
    assert not torch.allclose(before[0, :6], after[0, :6])


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_transformers_module_packs_documents_by_position_ids(arch):
    """The transformers path: the module's own packed-sequence masks from the same position_ids."""
    transformers = pytest.importorskip("transformers")
    from dsrecipes.models.hf_module import HFCausalLM

    torch.manual_seed(0)
    config_class = transformers.Qwen3Config if arch == "qwen3" else transformers.LlamaConfig
    config = config_class(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    config._attn_implementation = "sdpa"
    hf = transformers.AutoModelForCausalLM.from_config(config).eval()
    model = HFCausalLM(hf, ModelConfig(n_layer=2, n_head=4, d_model=32, vocab_size=64, max_seq_len=64))
    assert_same_loss_and_grads(model, DOCS)


# ------------------------------------------------------------------------------------------------ the loss mean
def test_token_weights_make_the_global_token_mean():
    """sum_i w_i * mean_i / gas == sum of all label losses / all labels (one process; the world-2 version is the
    equivalence row sft-chat-documents-dp2-zero3), and equal counts give weights of exactly 1."""
    torch.manual_seed(0)
    losses = [torch.rand(4, 6) for _ in range(3)]
    labels = [torch.where(torch.rand(4, 6) < p, 1, -100) for p in (0.2, 0.5, 0.9)]
    means = [loss[lab != -100].mean() for loss, lab in zip(losses, labels)]
    weights = token_weights(labels, 3, torch.device("cpu"))
    global_mean = torch.cat([loss[lab != -100] for loss, lab in zip(losses, labels)]).mean()
    assert abs(float(sum(w * m for w, m in zip(weights, means)) / 3 - global_mean)) <= 1e-7
    assert token_weights([torch.ones(2, 3)] * 2, 2, torch.device("cpu")) == [1.0, 1.0]


def test_accumulated_micro_batches_equal_the_whole_batch(tmp_path):
    """The Engine at accumulation 2 with global_tokens == one micro-batch of both halves (loss and gradients), and
    micro_batch (DeepSpeed's) == the mean of the two halves' means."""
    from dsrecipes.training.runners import MicroBatchRunner

    torch.manual_seed(0)
    model = GPT(ModelConfig(style="llama", n_layer=1, n_head=2, d_model=16, vocab_size=64, max_seq_len=32))
    ids = torch.randint(0, 64, (4, 12))
    labels = torch.where(torch.rand(4, 12) < torch.tensor([[0.1], [0.9], [0.5], [0.3]]), ids, -100)
    halves = [{"input_ids": ids[:2], "labels": labels[:2]}, {"input_ids": ids[2:], "labels": labels[2:]}]

    class Engine:  # the three calls a MicroBatchRunner makes, as the Engine makes them (backward divides by gas)
        device, gradient_accumulation_steps = torch.device("cpu"), 2

        def __call__(self, input_ids, labels):
            return model(input_ids, labels=labels)

        def backward(self, loss):
            (loss / 2).backward()

        def step(self):
            pass

    def run(token_weighted):
        model.zero_grad()
        stream = iter(halves)
        totals = MicroBatchRunner(token_weighted=token_weighted).train_batch(Engine(), lambda: next(stream))
        return float(totals["loss"]) / 2, [p.grad.clone() for p in model.parameters()]

    model.zero_grad()
    whole = model(ids, labels=labels).loss
    whole.backward()
    whole = whole.detach()
    whole_grads = [p.grad.clone() for p in model.parameters()]
    loss, grads = run(True)
    assert abs(loss - float(whole)) <= 1e-6
    assert all(torch.allclose(g, w, atol=1e-6, rtol=0) for g, w in zip(grads, whole_grads))
    per_micro, _ = run(False)
    with torch.no_grad():
        means = [float(model(h["input_ids"], labels=h["labels"]).loss) for h in halves]
    # (a random model's losses are all near log(64), so the two means differ by only ~1e-4 here)
    assert abs(per_micro - sum(means) / 2) <= 1e-6 and abs(per_micro - float(whole)) > 5e-5


# ------------------------------------------------------------------------------------------------ bad data
def bad(tmp_path, rows, **overrides):
    cfg = DataConfig(source="files", paths=[str(write_jsonl(tmp_path / "d.jsonl", rows))],
                     cache_dir=str(tmp_path / "cache"), block_size=64, **overrides)
    with pytest.raises(ValueError) as err:
        validate_data_config(cfg)
        prepare_data(cfg)
    return str(err.value)


def test_bad_data_stops_with_one_line(tmp_path):
    message = bad(tmp_path, [{"question": "a", "completion": "b"}], format="prompt_completion")
    assert "data.prompt_field='prompt' is not a column" in message and "question" in message
    message = bad(tmp_path, [{"prompt": "a", "completion": "b"}, {"prompt": "c", "completion": "  "}] * 3,
                  format="prompt_completion")
    assert message.startswith("data: row 1: empty completion (data.completion_field='completion')")
    message = bad(tmp_path, [{"messages": [{"role": "user", "content": "hi"}]}] * 4, format="chat",
                  chat_template="plain")
    assert "row 0" in message and "no assistant turn" in message and "data.train_on=all" in message
    message = bad(tmp_path, [{"prompt": "x" * 100, "completion": "y"}] * 4, format="prompt_completion",
                  packing="none", overlong="refuse")
    assert "longer than a row of block_size + 1 = 65 tokens" in message and "data.overlong=truncate" in message
    message = bad(tmp_path, [{"messages": CONVERSATIONS[0]}] * 4, format="chat")
    assert "data.chat_template is null and data.tokenizer=byte has no chat template" in message
    assert "chatml, llama3, plain" in message
    message = bad(tmp_path, [{"prompt": "a", "completion": "b"}] * 4, format="prompt_completion", train_on="assistant")
    assert message.startswith("data.train_on=assistant is not valid for data.format=prompt_completion")
