"""Chat prompts: messages -> the Target's chat template -> token ids.

The template is the model's own (GGUF ``tokenizer.chat_template`` or the Hugging
Face tokenizer's), rendered in a sandboxed Jinja environment with the variables
transformers' ``apply_chat_template`` and llama-cpp-python's ``Jinja2ChatFormatter``
pass (``messages``, ``add_generation_prompt``, ``bos_token``, ``eos_token``,
``raise_exception``). The rendered text's control-token spellings (``<|im_start|>``)
become their ids; the messages' own text never does (it is plain text).
"""

from __future__ import annotations

import re
from functools import lru_cache

from assistd.ground.errors import InputError
from assistd.targets.base import Target

# Used when a model declares no template: ChatML, the most common format.
CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
          "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")

ROLES = ("system", "user", "assistant", "tool", "developer")


@lru_cache(maxsize=8)
def _compile(template: str):
    from jinja2.exceptions import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    return env.from_string(template)


def _pieces(target: Target) -> list[bytes]:
    """``target.pieces()``, built once per Target (it walks the whole vocabulary)."""
    cached = getattr(target, "_assistd_pieces", None)
    if cached is None:
        cached = target._assistd_pieces = target.pieces()
    return cached


def _piece(target: Target, i: int | None) -> str:
    if i is None:
        return ""
    return _pieces(target)[i].decode("utf-8", errors="replace")


def render(target: Target, messages: list[dict], add_generation_prompt: bool = True) -> str:
    """Messages ``[{"role", "content"}]`` -> the prompt text of the Target's template.

    Raises :class:`InputError` when the template rejects the conversation (e.g. roles
    out of order for a template that checks them)."""
    from jinja2.exceptions import TemplateError

    template = getattr(target, "_assistd_template", None)
    if template is None:  # the GGUF header is parsed once per Target, not per request
        template = target._assistd_template = target.chat_template() or CHATML
    eos = min(target.eos_token_ids) if target.eos_token_ids else None
    try:
        return _compile(template).render(
            messages=messages, add_generation_prompt=add_generation_prompt,
            bos_token=_piece(target, target.bos_token_id), eos_token=_piece(target, eos))
    except TemplateError as e:
        raise InputError(f"the model's chat template rejected the messages: {e}") from None


def _pattern(target: Target, table: dict[str, int]) -> re.Pattern | None:
    """The regex of ``table``'s spellings, longest first; rebuilt when the table grows
    (a remote Target's learns)."""
    cached = getattr(target, "_assistd_control_pattern", None)
    if cached is None or cached[0] != len(table):
        names = sorted(table, key=len, reverse=True)
        cached = (len(table), re.compile("|".join(map(re.escape, names))) if names else None)
        target._assistd_control_pattern = cached
    return cached[1]


def tokenize_with_specials(target: Target, text: str) -> list[int]:
    """Tokenize ``text``, turning control-token spellings into their ids
    (:meth:`Target.control_spellings`).

    >>> class T(Target):  # a toy Target: one character per token, "<s>" special
    ...     def pieces(self): return [b"<s>"] + [bytes([c]) for c in range(1, 128)]
    ...     def special_ids(self): return frozenset({0})
    ...     def tokenize(self, text): return [ord(c) for c in text]
    >>> tokenize_with_specials(T(), "a<s>b")
    [97, 0, 98]
    """
    table = target.control_spellings(text)
    pattern = _pattern(target, table)
    if pattern is None:
        return target.tokenize(text)
    out: list[int] = []
    pos = 0
    for m in pattern.finditer(text):
        if m.start() > pos:
            out += target.tokenize(text[pos:m.start()])
        out.append(table[m.group()])
        pos = m.end()
    if pos < len(text):
        out += target.tokenize(text[pos:])
    return out


def message_text(content) -> str:
    """A message's content: a string, or OpenAI's list of parts (text parts joined).

    Raises :class:`InputError` for non-text parts (images, audio)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for part in content:
        if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(
                part.get("text"), str):
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise InputError(f"message content part of type {kind!r} is not supported;"
                             " only text parts are")
        parts.append(part["text"])
    return "".join(parts)


def chat_prompt_ids(target: Target, messages: list[dict]) -> list[int]:
    """The token ids of a chat prompt, ending where the assistant's reply starts.

    Only the template's own text may hold control tokens: each message's content is
    rendered as a marker, and tokenized as plain text in its place, so a message that
    contains ``<|im_start|>system`` cannot forge a turn (it is text, as in
    ``/v1/completions``)."""
    markers = [f"\ue000{i}\ue001" for i in range(len(messages))]
    shown = [{**m, "content": mk} for m, mk in zip(messages, markers)]
    text = render(target, shown)
    ids: list[int] = []
    pos = 0
    for m in re.finditer("\ue000(\\d+)\ue001", text):
        ids += tokenize_with_specials(target, text[pos:m.start()])
        ids += target.tokenize(messages[int(m.group(1))]["content"])
        pos = m.end()
    ids += tokenize_with_specials(target, text[pos:])
    bos = target.bos_token_id
    if target.add_bos and bos is not None and (not ids or ids[0] != bos):
        ids = [bos] + ids
    return ids
