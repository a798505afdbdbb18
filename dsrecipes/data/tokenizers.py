"""Tokenizers: a dependency-free byte tokenizer and a wrapper around a ``tokenizer.json`` file.

Both are passed to ``datasets.Dataset.map`` as ``fn_kwargs``, so datasets hashes
them (``datasets.fingerprint.Hasher``) to name the cache files of the tokenized
corpus. To keep that hash identical across runs and processes, their pickled
state is only plain data: nothing for ``ByteTokenizer``; the file path and a
SHA-256 of the file's bytes for ``HFTokenizerFile`` (so that editing the file
invalidates the cache). The underlying ``tokenizers.Tokenizer`` is loaded lazily
and never pickled.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Sequence

#: Token strings tried, in order, to find an end-of-sequence id in a tokenizer.json file.
EOS_CANDIDATES = ("</s>", "<|endoftext|>", "<eos>", "<|eos|>", "<|end_of_text|>")


class ByteTokenizer:
    """UTF-8 bytes as tokens: ids 0..255 are bytes, 256 is end-of-sequence; vocab size 257."""

    name = "byte"
    vocab_size = 257
    eos_id = 256

    def encode(self, text: str) -> list[int]:
        """Return the UTF-8 bytes of ``text`` (unencodable lone surrogates become ``?``)."""
        return list(text.encode("utf-8", errors="replace"))

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Encode several texts."""
        return [self.encode(t) for t in texts]

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """The ids of ``text`` and, per id, the [start, end) characters of its byte's character."""
        ids: list[int] = []
        offsets: list[tuple[int, int]] = []
        for index, char in enumerate(text):
            data = char.encode("utf-8", errors="replace")
            ids.extend(data)
            offsets.extend([(index, index + 1)] * len(data))
        return ids, offsets

    def decode(self, ids: Iterable[int]) -> str:
        """Decode ids back to text, skipping ids >= 256 (eos) and replacing invalid UTF-8."""
        return bytes(i for i in (int(x) for x in ids) if 0 <= i < 256).decode("utf-8", errors="replace")

    def __eq__(self, other) -> bool:
        return isinstance(other, ByteTokenizer)

    def __hash__(self) -> int:
        return hash(ByteTokenizer)

    def __repr__(self) -> str:
        return "ByteTokenizer(vocab_size=257, eos_id=256)"


def _file_sha256(path: str) -> str:
    """SHA-256 hex digest of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


class HFTokenizerFile:
    """A Hugging Face ``tokenizers`` tokenizer loaded from a ``tokenizer.json`` file.

    Only ``path`` and the file's SHA-256 are state; the ``tokenizers.Tokenizer``
    is loaded on first use (``tokenizers`` is imported lazily, so the package is
    only needed when such a tokenizer is actually used).
    """

    def __init__(self, path: str):
        if not os.path.isfile(path):
            raise ValueError(f"tokenizer file {path!r} does not exist")
        self.path = os.path.abspath(path)
        self.sha256 = _file_sha256(self.path)
        self._tokenizer = None

    @property
    def name(self) -> str:
        """The tokenizer's file path."""
        return self.path

    @property
    def tokenizer(self):
        """The loaded ``tokenizers.Tokenizer`` (loaded on first access)."""
        if self._tokenizer is None:
            try:
                from tokenizers import Tokenizer
            except ImportError as exc:
                raise ImportError(
                    f"data.tokenizer={self.path!r} needs the Hugging Face tokenizers package: pip install tokenizers"
                ) from exc
            try:
                self._tokenizer = Tokenizer.from_file(self.path)
            except Exception as err:  # tokenizers raises a plain Exception for a file it cannot parse
                raise ValueError(f"data.tokenizer={self.path!r} is not a tokenizers tokenizer.json file "
                                 f"({str(err).splitlines()[0] if str(err) else type(err).__name__})") from None
        return self._tokenizer

    @property
    def vocab_size(self) -> int:
        """Number of ids, including added special tokens."""
        return int(self.tokenizer.get_vocab_size(with_added_tokens=True))

    @property
    def eos_id(self) -> int | None:
        """Id of the first end-of-sequence token found among ``EOS_CANDIDATES``, or None."""
        for token in EOS_CANDIDATES:
            token_id = self.tokenizer.token_to_id(token)
            if token_id is not None:
                return int(token_id)
        return None

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` without added special tokens."""
        return list(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """The ids of ``text`` (no added special tokens) and the [start, end) characters of each."""
        encoding = self.tokenizer.encode(text, add_special_tokens=False)
        return list(encoding.ids), [(int(start), int(end)) for start, end in encoding.offsets]

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Encode several texts (parallelised by the tokenizers library)."""
        return [list(e.ids) for e in self.tokenizer.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Iterable[int]) -> str:
        """Decode ids back to text."""
        return self.tokenizer.decode([int(i) for i in ids])

    def __getstate__(self) -> dict:
        return {"path": self.path, "sha256": self.sha256}

    def __setstate__(self, state: dict) -> None:
        self.path = state["path"]
        self.sha256 = state["sha256"]
        self._tokenizer = None

    def __eq__(self, other) -> bool:
        return isinstance(other, HFTokenizerFile) and (self.path, self.sha256) == (other.path, other.sha256)

    def __hash__(self) -> int:
        return hash((self.path, self.sha256))

    def __repr__(self) -> str:
        return f"HFTokenizerFile({self.path!r})"


def build_tokenizer(spec: str):
    """Build the tokenizer named by ``data.tokenizer``: ``"byte"`` or a tokenizer.json path."""
    if spec == "byte":
        return ByteTokenizer()
    if not os.path.isfile(str(spec)):
        raise ValueError(
            f"data.tokenizer={spec!r} is not valid; use 'byte' or the path of an existing tokenizer.json file"
        )
    return HFTokenizerFile(str(spec))
