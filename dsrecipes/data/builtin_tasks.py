"""The built-in instruction data: small tasks with one right answer, generated offline and deterministically.

    rows = builtin_task_rows("chat", num_samples=2000, seed=0)   # [{"messages": [...]}, ...]

data.source=builtin with data.format=prompt_completion or chat reads these (format=text reads the standard
library's source files). Four kinds of task, over words taken from Python itself (keywords and builtin names, so
nothing is downloaded): add two numbers, spell a word backwards, write words in capitals, count the letters of a
word. About one sample in five carries a long reference passage (a standard-library module docstring) before
its question, so the lengths are skewed as real chat data is (what packing=documents is measured on). A chat
sample has an optional system message and one to three user/assistant turns.

The same tasks give preference pairs (`format="preference"`: prompt, chosen = the right answer, rejected = a
wrong one) for DPO.
"""

from __future__ import annotations

import builtins
import keyword
import random
import sys

_SYSTEM = "You are a precise assistant. Answer in one short sentence."


def _words() -> list[str]:
    names = sorted({*keyword.kwlist, *(n for n in dir(builtins) if n.isalpha() and n.islower())})
    return [n for n in names if 2 <= len(n) <= 12]


def _passages() -> list[str]:
    """Docstrings of standard-library modules already imported by any Python (offline, deterministic order)."""
    texts = []
    for name in ("json", "random", "keyword", "builtins", "os", "re", "string", "textwrap", "collections"):
        module = sys.modules.get(name) or __import__(name)
        doc = (module.__doc__ or "").strip()
        if len(doc) > 200:
            texts.append(" ".join(doc.split())[:900])
    return texts


def _task(rng: random.Random, words: list[str]) -> tuple[str, str, str]:
    """(question, right answer, a wrong answer)."""
    kind = rng.randrange(4)
    if kind == 0:
        a, b = rng.randrange(10, 100), rng.randrange(10, 100)
        return f"What is {a} plus {b}?", f"{a} plus {b} is {a + b}.", f"{a} plus {b} is {a + b + rng.choice((-10, 1, 10))}."
    word = rng.choice(words)
    if kind == 1:
        return f"Spell '{word}' backwards.", f"'{word}' backwards is '{word[::-1]}'.", f"'{word}' backwards is '{word}'."
    if kind == 2:
        pair = f"{word} {rng.choice(words)}"
        return f"Write '{pair}' in capital letters.", f"{pair.upper()}.", f"{pair.capitalize()}."
    return (f"How many letters are in '{word}'?", f"'{word}' has {len(word)} letters.",
            f"'{word}' has {len(word) + 1} letters.")


def _question(rng: random.Random, question: str, passages: list[str]) -> str:
    if rng.random() < 0.2:
        return f"Here is some reference text: {rng.choice(passages)[:rng.randint(100, 360)]}\n\n{question}"
    return question


def builtin_task_rows(format: str, num_samples: int = 2000, seed: int = 0) -> list[dict]:
    """Rows of the built-in tasks for data.format (prompt_completion, chat) or preference (DPO pairs)."""
    rng = random.Random(seed)
    words, passages = _words(), _passages()
    rows = []
    for _ in range(num_samples):
        if format == "chat":
            messages = [{"role": "system", "content": _SYSTEM}] if rng.random() < 0.5 else []
            for turn in range(rng.randint(1, 3)):
                question, answer, _ = _task(rng, words)
                messages.append({"role": "user", "content": _question(rng, question, passages) if turn == 0
                                 else question})
                messages.append({"role": "assistant", "content": answer})
            rows.append({"messages": messages})
            continue
        question, answer, wrong = _task(rng, words)
        prompt = f"Question: {_question(rng, question, passages)}\nAnswer: "
        if format == "preference":
            rows.append({"prompt": prompt, "chosen": answer, "rejected": wrong})
        else:
            rows.append({"prompt": prompt, "completion": answer})
    return rows
