"""The tokenizer files of a Hugging Face export directory.

    info = write_tokenizer_files("byte", out_dir, model_max_length=128)
    # -> {"tokenizer": "byte", "bos_token_id": 256, "eos_token_id": 256}; out_dir/tokenizer.json + tokenizer_config.json

An HF tokenizer (data.tokenizer=PATH/tokenizer.json) is copied in, with the files beside it that
transformers reads (tokenizer_config.json, special_tokens_map.json, a chat template) when it is an
HF directory's own tokenizer.json; a minimal tokenizer_config.json is written where there is none.

dsrecipes' byte tokenizer (ids 0..255 = UTF-8 bytes, 256 = end of text) is written as a tokenizers-
library tokenizer.json that encodes to the same ids: the ByteLevel pre-tokenizer (no regex split, no
prefix space) maps each byte to GPT-2's printable stand-in character, and a BPE model with no merges
whose vocabulary gives stand-in of byte b the id b turns each into one token; <|endoftext|> is 256.
So `AutoTokenizer.from_pretrained(export)` reads what dsrecipes trained on. JSON only: writing it
needs neither tokenizers nor transformers.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
# Files of an HF directory's tokenizer that travel with its tokenizer.json.
COMPANION_FILES = (TOKENIZER_CONFIG, "special_tokens_map.json", "added_tokens.json", "chat_template.jinja")
BYTE_EOS = "<|endoftext|>"
BOS_CANDIDATES = ("<s>", "<|begin_of_text|>", "<bos>")


def byte_to_unicode() -> dict[int, str]:
    """GPT-2's map of the 256 bytes to printable characters (what tokenizers' ByteLevel uses)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def byte_tokenizer_json() -> dict:
    """tokenizer.json equivalent to dsrecipes.data.tokenizers.ByteTokenizer (see the module docstring)."""
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    vocab = {char: b for b, char in byte_to_unicode().items()}
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": 256, "content": BYTE_EOS, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True}],
        "normalizer": None, "pre_tokenizer": byte_level, "post_processor": None, "decoder": byte_level,
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": []},
    }


def _token_content(value) -> str | None:
    return value.get("content") if isinstance(value, dict) else value


def _special_ids(tokenizer_json: Path, tokenizer_config: dict):
    """(bos id, eos id, the tokenizers.Tokenizer): tokenizer_config.json's bos/eos tokens, else the usual
    names (bos falls back to eos, GPT-2's convention)."""
    from dsrecipes.data.tokenizers import EOS_CANDIDATES, HFTokenizerFile

    tokenizer = HFTokenizerFile(str(tokenizer_json)).tokenizer

    def first_id(names):
        ids = [tokenizer.token_to_id(n) for n in names if n]
        return next((int(i) for i in ids if i is not None), None)

    eos = first_id([_token_content(tokenizer_config.get("eos_token")), *EOS_CANDIDATES])
    bos = first_id([_token_content(tokenizer_config.get("bos_token")), *BOS_CANDIDATES])
    return (eos if bos is None else bos), eos, tokenizer


def write_tokenizer_files(spec: str, out_dir: str | Path, model_max_length: int) -> dict:
    """Write the tokenizer of `spec` ("byte" or a tokenizer.json path) into out_dir.

    Returns {"tokenizer": how dsrecipes reads it back ("byte", or "tokenizer.json" relative to out_dir),
    "bos_token_id", "eos_token_id"}.
    """
    out_dir = Path(out_dir)
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": model_max_length,
              "clean_up_tokenization_spaces": False}
    if spec == "byte":
        (out_dir / TOKENIZER_FILE).write_text(json.dumps(byte_tokenizer_json(), ensure_ascii=False))
        config.update(bos_token=BYTE_EOS, eos_token=BYTE_EOS, pad_token=BYTE_EOS)
        (out_dir / TOKENIZER_CONFIG).write_text(json.dumps(config, indent=2))
        return {"tokenizer": "byte", "bos_token_id": 256, "eos_token_id": 256}
    source = Path(spec)
    if not source.is_file():
        raise ValueError(f"data.tokenizer={spec!r} is not a tokenizer.json file; the export copies the tokenizer in")
    target = out_dir / TOKENIZER_FILE
    if source.resolve() != target.resolve():
        shutil.copyfile(source, target)
    if source.name == TOKENIZER_FILE:  # an HF directory's tokenizer: its companions come along
        for name in COMPANION_FILES:
            if (source.parent / name).is_file() and (source.parent / name).resolve() != (out_dir / name).resolve():
                shutil.copyfile(source.parent / name, out_dir / name)
    if (out_dir / TOKENIZER_CONFIG).is_file():
        config = json.loads((out_dir / TOKENIZER_CONFIG).read_text())
    bos, eos, tokenizer = _special_ids(target, config)
    if not (out_dir / TOKENIZER_CONFIG).is_file():
        if eos is not None:
            config.update(eos_token=tokenizer.id_to_token(eos), bos_token=tokenizer.id_to_token(bos))
        (out_dir / TOKENIZER_CONFIG).write_text(json.dumps(config, indent=2))
    return {"tokenizer": TOKENIZER_FILE, "bos_token_id": bos, "eos_token_id": eos}


def resolve_tokenizer(spec: str | None, directory: str | Path) -> str | None:
    """A recorded tokenizer as build_tokenizer takes it: "byte", or a path (relative ones are inside `directory`)."""
    if spec in (None, "byte"):
        return spec
    inside = Path(directory) / spec
    return str(inside.resolve()) if not Path(spec).is_absolute() and inside.is_file() else spec
