"""Tests of dsrecipes.data: sources, tokenizers, split/pack/cache, resumable batches (CPU, offline, fast)."""

import json
import os
import pickle

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from datasets.fingerprint import Hasher

from dsrecipes.data import (
    BatchIterator,
    ByteTokenizer,
    DataConfig,
    HFTokenizerFile,
    build_tokenizer,
    eval_batches,
    prepare_data,
    sources,
    validate_data_config,
)
from dsrecipes.data.packing import split_documents

MAX_BYTES = 200_000


def builtin_cfg(cache_dir, **overrides):
    """A small builtin-corpus config with its own cache directory."""
    values = dict(source="builtin", cache_dir=str(cache_dir), max_bytes=MAX_BYTES, block_size=64, val_fraction=0.2)
    values.update(overrides)
    return DataConfig(**values)


@pytest.fixture(scope="module")
def builtin_cache(tmp_path_factory):
    """A cache directory shared by the builtin-corpus tests of this module."""
    return tmp_path_factory.mktemp("hf_cache")


@pytest.fixture(scope="module")
def prepared(builtin_cache):
    """The small builtin corpus, prepared once for the module."""
    return prepare_data(builtin_cfg(builtin_cache))


def token_dataset(num_blocks, block_len=5):
    """A packed-like dataset whose block i is filled with the value i (so rows identify themselves)."""
    return datasets.Dataset.from_dict({"tokens": [[i] * block_len for i in range(num_blocks)]})


def row_ids(batch):
    """The block indices of a batch built from ``token_dataset``."""
    return batch["input_ids"][:, 0].tolist()


# ----------------------------------------------------------------------------- corpus and packing


def test_builtin_corpus_loads_and_packs(prepared):
    tok = prepared.tokenizer
    assert isinstance(tok, ByteTokenizer)
    assert prepared.num_documents >= 2
    for split in (prepared.train, prepared.validation):
        assert len(split) > 0
        blocks = torch.tensor(split.with_format("numpy")[:]["tokens"])
        assert blocks.shape[1] == 64 + 1
        assert int(blocks.min()) >= 0 and int(blocks.max()) < tok.vocab_size
    assert prepared.num_train_tokens == len(prepared.train) * 64
    assert prepared.num_val_tokens == len(prepared.validation) * 64
    assert prepared.vocab_size == 257
    text = tok.decode(prepared.train[0]["tokens"])
    assert len(text) > 0
    all_train = torch.tensor(prepared.train.with_format("numpy")[:]["tokens"])
    assert bool((all_train == tok.eos_id).any()), "documents are separated by eos"


def test_max_bytes_takes_whole_files_in_sorted_order():
    files = sources.builtin_files()
    taken = sources.cap_files_by_size(files, MAX_BYTES)
    assert taken == files[: len(taken)]
    assert sum(os.path.getsize(f) for f in taken) <= MAX_BYTES or len(taken) == 1
    assert sources.cap_files_by_size(files, 1) == files[:1]


def test_split_is_deterministic_and_disjoint(builtin_cache):
    cfg = builtin_cfg(builtin_cache)
    first = [split_documents(sources.load_documents(cfg), 0.2, 7) for _ in range(2)]
    (train_a, val_a), (train_b, val_b) = first
    assert list(train_a["text"]) == list(train_b["text"]) and list(val_a["text"]) == list(val_b["text"])
    assert len(val_a) >= 1 and len(train_a) + len(val_a) == len(sources.load_documents(cfg))
    assert not set(train_a["text"]) & set(val_a["text"])
    _, val_other = split_documents(sources.load_documents(cfg), 0.2, 8)
    assert len(val_other) == len(val_a)


def test_prepare_is_deterministic_across_fresh_caches(prepared, tmp_path):
    again = prepare_data(builtin_cfg(tmp_path / "fresh"))
    assert not again.from_cache
    assert list(again.train["tokens"]) == list(prepared.train["tokens"])
    assert list(again.validation["tokens"]) == list(prepared.validation["tokens"])


def test_second_prepare_reuses_cache(tmp_path):
    cfg = builtin_cfg(tmp_path / "cache", block_size=32)
    messages = []
    first = prepare_data(cfg, status=messages.append)
    second = prepare_data(cfg)
    assert first.from_cache is False
    assert second.from_cache is True
    assert first.cache_files and second.cache_files == first.cache_files
    assert all(os.path.isfile(f) for f in second.cache_files)
    assert list(second.train["tokens"]) == list(first.train["tokens"])
    assert any("Tokenizing" in m for m in messages) and "computed" in messages[-1]
    third = prepare_data(builtin_cfg(tmp_path / "cache", block_size=48))
    assert third.from_cache is False, "a different block_size must not reuse the packed cache"
    for f in first.cache_files:
        os.remove(f)
    assert prepare_data(cfg).from_cache is False, "a deleted cache is recomputed and reported as such"


# ----------------------------------------------------------------------------- local files and hub


def test_local_text_files_and_directories(tmp_path):
    docs = tmp_path / "docs"
    (docs / "sub").mkdir(parents=True)
    (docs / "a.txt").write_text("alpha " * 200, encoding="utf-8")
    (docs / "sub" / "b.md").write_text("# beta\n" + "béta ✓ " * 200, encoding="utf-8")
    (docs / "c.py").write_text("print('gamma')\n" * 100, encoding="utf-8")
    (docs / "ignored.bin").write_bytes(b"\x00\x01")
    cfg = DataConfig(source="files", paths=[str(docs)], cache_dir=str(tmp_path / "cache"), block_size=16,
                     val_fraction=0.3)
    out = prepare_data(cfg)
    assert out.num_documents == 3
    assert len(out.train) > 0 and len(out.validation) > 0
    text = "".join(out.tokenizer.decode(b) for b in list(out.train["tokens"]) + list(out.validation["tokens"]))
    assert "alpha" in text and "béta ✓" in text and "gamma" in text


def test_local_jsonl_with_custom_text_field(tmp_path):
    path = tmp_path / "corpus.jsonl"
    with open(path, "w", encoding="utf-8") as f:
        for i in range(20):
            f.write(json.dumps({"id": i, "body": f"document number {i} " * 30}) + "\n")
    cfg = DataConfig(source="files", paths=[str(path)], text_field="body", cache_dir=str(tmp_path / "cache"),
                     block_size=32, val_fraction=0.1)
    out = prepare_data(cfg)
    assert out.num_documents == 20
    assert out.train.column_names == ["tokens"]
    capped = sources.load_documents(DataConfig(source="files", paths=[str(path)], text_field="body",
                                               cache_dir=str(tmp_path / "cache"), max_bytes=1000))
    assert 1 <= len(capped) < 20 and capped["text"][0].startswith("document number 0 ")


def test_local_parquet(tmp_path):
    path = tmp_path / "corpus.parquet"
    pq.write_table(pa.table({"text": [f"parquet row {i} " * 25 for i in range(10)], "n": list(range(10))}), path)
    cfg = DataConfig(source="files", paths=[str(path)], cache_dir=str(tmp_path / "cache"), block_size=32,
                     val_fraction=0.2)
    out = prepare_data(cfg)
    assert out.num_documents == 10
    assert "parquet row" in out.tokenizer.decode(out.train[0]["tokens"])


def test_missing_text_field_names_columns(tmp_path):
    path = tmp_path / "corpus.jsonl"
    path.write_text('{"body": "x"}\n{"body": "y"}\n', encoding="utf-8")
    cfg = DataConfig(source="files", paths=[str(path)], cache_dir=str(tmp_path / "cache"))
    with pytest.raises(ValueError, match=r"data.text_field='text'.*available columns: body"):
        prepare_data(cfg)


def test_mixed_file_kinds_rejected(tmp_path):
    (tmp_path / "a.txt").write_text("a", encoding="utf-8")
    (tmp_path / "b.jsonl").write_text('{"text": "b"}\n', encoding="utf-8")
    cfg = DataConfig(source="files", paths=[str(tmp_path / "a.txt"), str(tmp_path / "b.jsonl")])
    with pytest.raises(ValueError, match=r"mixes file kinds.*json: .*b\.jsonl.*text: .*a\.txt"):
        prepare_data(cfg)


def test_hub_source_uses_load_dataset_and_text_field(monkeypatch):
    calls = []

    def fake_load_dataset(name, config=None, split=None, cache_dir=None):
        calls.append((name, config, split, cache_dir))
        return datasets.Dataset.from_dict({"content": ["one", "two", "three"], "meta": [1, 2, 3]})

    monkeypatch.setattr(sources.datasets, "load_dataset", fake_load_dataset)
    cfg = DataConfig(source="hub", hub_name="someone/corpus", hub_config="raw", hub_split="validation",
                     text_field="content", max_bytes=6)
    docs = sources.load_documents(cfg)
    assert calls == [("someone/corpus", "raw", "validation", None)]
    assert docs.column_names == ["text"] and list(docs["text"]) == ["one", "two"]


# ----------------------------------------------------------------------------- config errors


def test_missing_path_is_named(tmp_path):
    missing = str(tmp_path / "nope" / "corpus.txt")
    with pytest.raises(ValueError, match=f"data.paths: '{missing}' does not exist"):
        prepare_data(DataConfig(source="files", paths=[missing]))


def test_unknown_source_lists_choices():
    with pytest.raises(ValueError, match=r"data.source='foo' is not valid; choose one of: builtin, files, hub"):
        validate_data_config(DataConfig(source="foo"))


@pytest.mark.parametrize(
    "overrides, pattern",
    [
        (dict(block_size=0), r"data.block_size=0"),
        (dict(val_fraction=1.0), r"data.val_fraction=1.0"),
        (dict(source="files"), r"data.paths is empty"),
        (dict(source="hub"), r"data.hub_name is not set"),
        (dict(tokenizer="/no/such/tokenizer.json"), r"data.tokenizer='/no/such/tokenizer.json'.*'byte'"),
    ],
)
def test_invalid_config_values(overrides, pattern):
    with pytest.raises(ValueError, match=pattern):
        validate_data_config(DataConfig(**overrides))


def test_corpus_too_small_is_explained(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(20):
        (docs / f"{i:02d}.txt").write_text("x" * 100, encoding="utf-8")  # 100 bytes + eos = 101 tokens
    cfg = DataConfig(source="files", paths=[str(docs)], cache_dir=str(tmp_path / "cache"), block_size=150,
                     val_fraction=0.05)
    with pytest.raises(ValueError, match=r"corpus too small: 101 tokens in validation, need at least "
                                         r"block_size\+1 = 151; lower data.block_size"):
        prepare_data(cfg)


def test_single_document_rejected(tmp_path):
    (tmp_path / "only.txt").write_text("just one document", encoding="utf-8")
    cfg = DataConfig(source="files", paths=[str(tmp_path / "only.txt")], cache_dir=str(tmp_path / "cache"))
    with pytest.raises(ValueError, match="corpus too small: 1 document"):
        prepare_data(cfg)


# ----------------------------------------------------------------------------- tokenizers


def test_byte_tokenizer_round_trip():
    tok = ByteTokenizer()
    text = "héllo wörld — ✓ 日本語 🐍\n\ttabs"
    ids = tok.encode(text)
    assert all(0 <= i < 256 for i in ids) and len(ids) == len(text.encode("utf-8"))
    assert tok.decode(ids) == text
    assert tok.decode(ids + [tok.eos_id]) == text, "eos is skipped when decoding"
    assert tok.decode(torch.tensor(ids)) == text
    assert tok.decode([0xC3]) == "\ufffd", "invalid UTF-8 is replaced, not raised"
    assert (tok.vocab_size, tok.eos_id) == (257, 256)
    assert isinstance(build_tokenizer("byte"), ByteTokenizer)


def test_tokenizers_pickle_and_hash_deterministically(tmp_path):
    assert Hasher.hash(ByteTokenizer()) == Hasher.hash(pickle.loads(pickle.dumps(ByteTokenizer())))
    path = tmp_path / "tokenizer.json"
    path.write_text('{"version": "1.0"}', encoding="utf-8")
    a, b = build_tokenizer(str(path)), HFTokenizerFile(str(path))
    assert isinstance(a, HFTokenizerFile)
    assert Hasher.hash(a) == Hasher.hash(b) == Hasher.hash(pickle.loads(pickle.dumps(a)))
    path.write_text('{"version": "1.0", "changed": true}', encoding="utf-8")
    assert Hasher.hash(HFTokenizerFile(str(path))) != Hasher.hash(a), "editing the file changes the hash"


def test_hf_tokenizer_file(tmp_path):
    try:
        import tokenizers
    except ImportError:
        path = tmp_path / "tokenizer.json"
        path.write_text("{}", encoding="utf-8")
        with pytest.raises(ImportError, match="pip install tokenizers"):
            HFTokenizerFile(str(path)).encode("hello")
        return
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    tok = tokenizers.Tokenizer(WordLevel({"<unk>": 0, "</s>": 1, "hello": 2, "world": 3}, unk_token="<unk>"))
    tok.pre_tokenizer = Whitespace()
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    wrapped = HFTokenizerFile(str(path))
    assert wrapped.encode("hello world") == [2, 3]
    assert wrapped.eos_id == 1 and wrapped.vocab_size == 4
    assert pickle.loads(pickle.dumps(wrapped)).encode_batch(["world hello"]) == [[3, 2]]


# ----------------------------------------------------------------------------- batches


def test_batches_from_prepared_data_are_shifted(prepared):
    batch = next(BatchIterator(prepared.train, 4, seed=0))
    assert batch["input_ids"].shape == (4, 64) and batch["input_ids"].dtype == torch.long
    assert torch.equal(batch["input_ids"][:, 1:], batch["labels"][:, :-1])


def test_resume_continues_identically_across_epoch_boundary():
    data = token_dataset(10)
    it = BatchIterator(data, 3, seed=5)
    assert it.batches_per_epoch == 3
    for _ in range(5):  # crosses the end of epoch 0 (3 batches)
        next(it)
    state = it.state_dict()
    assert state == {"epoch": 1, "batch_in_epoch": 2, "seed": 5, "micro_batch_size": 3, "world_size": 1}
    expected = [next(it) for _ in range(6)]
    resumed = BatchIterator(data, 3, seed=5)
    resumed.load_state_dict(state)
    got = [next(resumed) for _ in range(6)]
    for e, g in zip(expected, got):
        assert torch.equal(e["input_ids"], g["input_ids"]) and torch.equal(e["labels"], g["labels"])
    assert resumed.epoch == it.epoch == 3


def test_epochs_are_permutations_with_tail_dropped():
    it = BatchIterator(token_dataset(10), 3, seed=1)
    epoch0 = [i for _ in range(3) for i in row_ids(next(it))]
    epoch1 = [i for _ in range(3) for i in row_ids(next(it))]
    assert len(set(epoch0)) == 9 and len(set(epoch1)) == 9
    assert epoch0 != epoch1
    plain = BatchIterator(token_dataset(10), 3, seed=1, shuffle=False)
    assert [row_ids(next(plain)) for _ in range(4)] == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [0, 1, 2]]


def test_ranks_split_the_global_batch():
    data = token_dataset(13)
    single = BatchIterator(data, 4, seed=3, world_size=1)
    rank0 = BatchIterator(data, 2, seed=3, rank=0, world_size=2)
    rank1 = BatchIterator(data, 2, seed=3, rank=1, world_size=2)
    assert rank0.batches_per_epoch == single.batches_per_epoch == 3
    seen = []
    for _ in range(6):  # two epochs
        whole, a, b = row_ids(next(single)), row_ids(next(rank0)), row_ids(next(rank1))
        assert not set(a) & set(b)
        assert a + b == whole
        seen.extend(a + b)
    assert len(set(seen[:12])) == 12, "no block repeats within an epoch"


def test_state_mismatch_and_bad_sizes_raise():
    data = token_dataset(10)
    state = BatchIterator(data, 2, seed=0).state_dict()
    for key, value in (("seed", 1), ("micro_batch_size", 3), ("world_size", 2)):
        other = dict(state, **{key: value})
        with pytest.raises(ValueError, match=key):
            BatchIterator(data, 2, seed=0).load_state_dict(other)
    with pytest.raises(ValueError, match="batch_in_epoch"):
        BatchIterator(data, 2, seed=0).load_state_dict({k: v for k, v in state.items() if k != "batch_in_epoch"})
    with pytest.raises(ValueError, match=r"10 blocks.*4\*3 = 12"):
        BatchIterator(data, 4, seed=0, world_size=3)
    with pytest.raises(ValueError, match="rank=2"):
        BatchIterator(data, 1, seed=0, rank=2, world_size=2)


def test_eval_batches_sequential_partial_and_rank_sliced():
    data = token_dataset(10)
    first = [row_ids(b) for b in eval_batches(data, 3)]
    assert first == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]
    assert [row_ids(b) for b in eval_batches(data, 3)] == first
    assert [row_ids(b) for b in eval_batches(data, 3, max_batches=2)] == first[:2]
    r0 = [row_ids(b) for b in eval_batches(data, 3, rank=0, world_size=2)]
    r1 = [row_ids(b) for b in eval_batches(data, 3, rank=1, world_size=2)]
    assert r0 == [[0, 1, 2], [6, 7, 8]] and r1 == [[3, 4, 5], [9]]
    batch = next(eval_batches(data, 2))
    assert batch["input_ids"].shape == (2, 4) and batch["labels"].dtype == torch.long


def test_position_carries_over_to_another_world_size_with_the_same_global_batch():
    data = token_dataset(40)
    single = BatchIterator(data, 4, seed=7)
    for _ in range(3):
        next(single)
    state = single.state_dict()
    expected = row_ids(next(single))
    halves = []
    for rank in (0, 1):
        it = BatchIterator(data, 2, seed=7, rank=rank, world_size=2)
        it.load_state_dict(state)
        halves += row_ids(next(it))
    assert halves == expected
