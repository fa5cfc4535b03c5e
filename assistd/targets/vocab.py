"""How llama.cpp spells and renders a vocabulary, for backends that must agree with it.

A torch Target of a GGUF file has to produce the same fingerprint, piece bytes and
end-of-generation ids as the llama.cpp Target of the same file, so that both share
one history and stop at the same tokens.
"""

from __future__ import annotations

import re

# llama.cpp (src/llama-vocab.cpp) picks end-of-generation ids by token text: these
# texts, the first FIM pad/repo/separator token of each list, and the EOS id.
EOG_TEXTS = frozenset({
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
})
FIM_EOG_TEXTS = (
    ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    ("<|file_sep|>",),
)


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table, in which byte-level BPE vocabularies are spelled.

    >>> t = bytes_to_unicode(); t[ord("a")], t[ord(" ")], t[ord("\\n")], len(set(t.values()))
    ('a', 'Ġ', 'Ċ', 256)
    """
    keep = {*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)}
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


_BYTE_OF = {c: b for b, c in bytes_to_unicode().items()}


def piece_bytes(piece: str | None, *, byte_level: bool, special: bool) -> bytes:
    """The bytes a token adds to detokenized text, as llama.cpp renders them (special=False).

    Special (control) tokens render as nothing; a byte-level piece maps back through
    GPT-2's table; a SentencePiece piece turns ``▁`` into a space and ``<0xNN>`` into a byte.

    >>> bpe, spm = dict(byte_level=True, special=False), dict(byte_level=False, special=False)
    >>> piece_bytes("Ġdef", **bpe), piece_bytes("▁x", **spm), piece_bytes("<0x0A>", **spm)
    (b' def', b' x', b'\\n')
    >>> piece_bytes("<|im_end|>", byte_level=True, special=True)
    b''
    """
    if piece is None or special:
        return b""
    if byte_level:
        if all(c in _BYTE_OF for c in piece):
            return bytes(_BYTE_OF[c] for c in piece)
        return piece.encode("utf-8")  # an added token spelled outside GPT-2's table
    if re.fullmatch(r"<0x[0-9A-Fa-f]{2}>", piece):
        return bytes([int(piece[3:5], 16)])
    return piece.replace("\u2581", " ").encode("utf-8")


def eog_ids(tok, model, texts: list[str | None]) -> frozenset[int]:
    """End-of-generation ids: the config's EOS ids plus llama.cpp's text rules (see EOG_TEXTS)."""
    ids = {i: t for i, t in enumerate(texts) if t is not None}
    by_text = {t: i for i, t in ids.items()}
    eog = {by_text[t] for t in EOG_TEXTS if t in by_text}
    for candidates in FIM_EOG_TEXTS:
        found = next((by_text[t] for t in candidates if t in by_text), None)
        if found is not None:
            eog.add(found)
    for source in (tok.eos_token_id, getattr(model.config, "eos_token_id", None),
                   getattr(model.generation_config, "eos_token_id", None)):
        eog.update(source if isinstance(source, (list, tuple)) else [] if source is None else [source])
    names = {ids.get(i) for i in eog}
    if "<|end|>" in names and ({"<|return|>", "<|call|>"} <= names or {"<|calls|>", "<|flush|>"} <= names):
        eog.discard(by_text["<|end|>"])  # llama.cpp: harmony / solar-open end a message, not a turn
    if {"<|tool_response>", "</s>"} <= names:
        eog.discard(by_text["</s>"])  # llama.cpp: gemma4
    return frozenset(i for i in eog if 0 <= i < len(texts))
