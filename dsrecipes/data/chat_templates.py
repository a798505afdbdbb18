"""Chat templates: find the one a run uses, render conversations with it, and locate the assistant turns.

    template = resolve_chat_template(data_cfg)               # the tokenizer's own, a built-in name, or a .jinja file
    text = template.render(messages)                          # what transformers' apply_chat_template renders
    text, spans = template.render_with_assistant_spans(messages)   # + [start, end) characters of each assistant turn

Rendering uses jinja2 the way transformers' `apply_chat_template` does (a sandboxed environment with trim_blocks
and lstrip_blocks, the loop-controls extension, a `tojson` filter that keeps non-ASCII text, `raise_exception` and
`strftime_now`; the tokenizer's special-token strings as `bos_token`, `eos_token`, ...), so that tokenizing the
rendered text without added special tokens gives apply_chat_template's ids. jinja2 is a dependency of torch.

The assistant spans are a template's `{% generation %}` blocks where it has them (transformers' own marking,
return_assistant_tokens_mask), else they come from renderings of the conversation's prefixes: the characters an
assistant turn adds
are those between `render(messages[:i], add_generation_prompt=True)` and `render(messages[:i+1])`. A template
whose prefixes are not prefixes of the whole rendering (one that rewrites earlier turns, e.g. by dropping their
reasoning) cannot be masked that way: that raises a ValueError saying so (data.train_on=all still works).
"""

from __future__ import annotations

import datetime
import json
import os
import re
from dataclasses import dataclass, field
from functools import lru_cache

#: Files beside a tokenizer.json that hold its chat template (newest transformers first).
TEMPLATE_FILE = "chat_template.jinja"
TOKENIZER_CONFIG = "tokenizer_config.json"
SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "unk_token", "pad_token")

# ChatML (Qwen's format): <|im_start|>role\ncontent<|im_end|>\n per message.
_CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# Llama 3's header format: a begin-of-text, then per message a role header and the content closed by <|eot_id|>.
_LLAMA3 = (
    "{{ '<|begin_of_text|>' }}"
    "{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + "
    "'<|eot_id|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)
# Plain text for tokenizers without special tokens (the byte tokenizer): "Role: content" lines, a blank line
# after each assistant turn.
_PLAIN = (
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}{{ 'Assistant: ' + message['content'] + '\\n\\n' }}"
    "{% elif message['role'] == 'system' %}{{ 'System: ' + message['content'] + '\\n' }}"
    "{% else %}{{ 'User: ' + message['content'] + '\\n' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ 'Assistant: ' }}{% endif %}"
)

#: data.chat_template names dsrecipes ships.
BUILTIN_TEMPLATES = {"chatml": _CHATML, "llama3": _LLAMA3, "plain": _PLAIN}


@dataclass(frozen=True)
class ChatTemplate:
    """A jinja chat template and the special-token strings it may use; picklable plain data (datasets hashes it
    to name its cache files)."""

    source: str
    text: str
    special_tokens: dict = field(default_factory=dict)

    def render(self, messages: list, add_generation_prompt: bool = False) -> str:
        """The conversation as text, exactly as apply_chat_template(tokenize=False) renders it."""
        return _compiled(self.text).render(messages=messages, add_generation_prompt=add_generation_prompt,
                                          **self.special_tokens)

    def render_with_assistant_spans(self, messages: list) -> tuple[str, list[tuple[int, int]]]:
        """The rendered conversation and the [start, end) character span of each assistant turn in it.

        Raises:
            ValueError: the template renders a prefix of the conversation that is not a prefix of the whole.
        """
        if _has_generation_tags(self.text):
            return _marked_spans(_compiled(self.text).render(messages=messages, add_generation_prompt=False,
                                                             **{MARK_VARIABLE: True}, **self.special_tokens))
        text = self.render(messages)
        spans = []
        for i, message in enumerate(messages):
            if message.get("role") != "assistant":
                continue
            before = self.render(messages[:i], add_generation_prompt=True)
            through = self.render(messages[:i + 1])
            if not (text.startswith(through) and through.startswith(before)):
                raise ValueError(f"the chat template ({self.source}) is not prefix-consistent: rendering the "
                                 f"conversation up to message {i} is not a prefix of rendering all of it, so the "
                                 "assistant tokens cannot be located; use data.train_on=all or another "
                                 "data.chat_template")
            spans.append((len(before), len(through)))
        return text, spans


# {% generation %} blocks (transformers' marking of what the assistant generates): rendered between these two
# private-use characters when MARK_VARIABLE is set, then cut out again with their positions as the spans
_OPEN, _CLOSE = "\ue000", "\ue001"
MARK_VARIABLE = "_dsrecipes_mark_generation"


def _has_generation_tags(text: str) -> bool:
    return re.search(r"{%-?\s*generation\s*-?%}", text) is not None


def _marked_spans(marked: str) -> tuple[str, list[tuple[int, int]]]:
    """The text without the markers and the [start, end) span each marked block occupies in it."""
    out, spans, start = [], [], None
    length = 0
    for piece in re.split(f"([{_OPEN}{_CLOSE}])", marked):
        if piece == _OPEN:
            start = length
        elif piece == _CLOSE:
            if start is not None and length > start:
                spans.append((start, length))
            start = None
        else:
            out.append(piece)
            length += len(piece)
    return "".join(out), spans


def _generation_extension():
    """A jinja2 extension for {% generation %}...{% endgeneration %}: the body as is, between markers when the
    render asks for them."""
    from jinja2 import nodes
    from jinja2.ext import Extension

    class Generation(Extension):
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.CallBlock(self.call_method("_block", [nodes.ContextReference()]), [], [], body) \
                .set_lineno(lineno)

        @staticmethod
        def _block(context, caller):
            body = caller()
            return f"{_OPEN}{body}{_CLOSE}" if context.get(MARK_VARIABLE) else body

    return Generation


def _raise(message: str):
    from jinja2.exceptions import TemplateError

    raise TemplateError(message)


@lru_cache(maxsize=16)
def _compiled(text: str):
    """The template compiled in a sandboxed jinja2 environment set up as transformers sets up its own."""
    from jinja2 import ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[ext.loopcontrols, _generation_extension()])
    env.filters["tojson"] = lambda value, indent=None, **kw: json.dumps(value, ensure_ascii=False, indent=indent,
                                                                         **kw)
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    return env.from_string(text)


def _token_string(value) -> str | None:
    """A special token from tokenizer_config.json: a string, or an AddedToken dict with its "content"."""
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


def tokenizer_chat_template(tokenizer_file: str) -> tuple[str | None, dict, str]:
    """(template text or None, special-token strings, where it was looked for) from the files beside a
    tokenizer.json: chat_template.jinja, else tokenizer_config.json's chat_template (its "default" entry when it
    holds several named templates)."""
    directory = os.path.dirname(os.path.abspath(tokenizer_file))
    config = {}
    config_path = os.path.join(directory, TOKENIZER_CONFIG)
    if os.path.isfile(config_path):
        with open(config_path, encoding="utf-8") as f:
            config = json.load(f)
    special = {key: _token_string(config.get(key)) for key in SPECIAL_TOKEN_KEYS if _token_string(config.get(key))}
    jinja_path = os.path.join(directory, TEMPLATE_FILE)
    if os.path.isfile(jinja_path):
        with open(jinja_path, encoding="utf-8") as f:
            return f.read(), special, jinja_path
    template = config.get("chat_template")
    if isinstance(template, list):  # [{"name": ..., "template": ...}, ...]
        named = {entry.get("name"): entry.get("template") for entry in template if isinstance(entry, dict)}
        template = named.get("default")
    if isinstance(template, str):
        return template, special, config_path
    return None, special, f"{jinja_path} or {config_path}"


def resolve_chat_template(cfg) -> ChatTemplate:
    """The chat template of a data config (format=chat): data.chat_template's built-in name or .jinja file, or,
    when it is null, the tokenizer's own.

    Raises:
        ValueError: naming data.chat_template, when neither gives a template.
    """
    name = cfg.chat_template
    tokenizer = str(cfg.tokenizer)
    text, special, looked = tokenizer_chat_template(tokenizer) if tokenizer != "byte" else (None, {}, "")
    choices = f"{', '.join(BUILTIN_TEMPLATES)} or the path of a .jinja file"
    if name is None:
        if tokenizer == "byte":
            raise ValueError(f"data.chat_template is null and data.tokenizer=byte has no chat template of its own; "
                             f"name one: {choices}")
        if text is None:
            raise ValueError(f"data.chat_template is null and the tokenizer {tokenizer} has no chat template "
                             f"(looked in {looked}); name one: {choices}")
        return ChatTemplate(f"the tokenizer's own, {looked}", text, special)
    if name in BUILTIN_TEMPLATES:
        return ChatTemplate(f"built-in {name}", BUILTIN_TEMPLATES[name], special)
    if os.path.isfile(str(name)):
        with open(str(name), encoding="utf-8") as f:
            return ChatTemplate(str(name), f.read(), special)
    raise ValueError(f"data.chat_template={name!r} is neither a built-in template nor an existing file; choose "
                     f"{choices}")


def check_chat_template(cfg) -> None:
    """Before any work: the template resolves and compiles (a syntax error names the file and line)."""
    template = resolve_chat_template(cfg)
    from jinja2.exceptions import TemplateSyntaxError

    try:
        _compiled(template.text)
    except TemplateSyntaxError as err:
        raise ValueError(f"data.chat_template ({template.source}) does not compile: {err.message} (line "
                         f"{err.lineno})") from None
