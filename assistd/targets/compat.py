"""Can a draft model draft for a Target? The tokenizer check (docs/design.md, 'Proposers').

A draft model proposes token ids that the Target verifies as its own, so both
must share one tokenizer: the same token->id map over every id (equal vocabulary
size proves nothing), the same control tokens, BOS, end-of-generation ids and
add-BOS rule, and, where both files declare one, the same chat template (both
must see the same formatted text). :func:`check_compatible` refuses any other
pair with a :class:`ModelError` that lists what differs; the comparison itself is
a pure function of two :class:`TokenizerInfo` (:func:`diff_tokenizers`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from assistd.ground.errors import ModelError
from assistd.targets.base import Target

MAX_EXAMPLES = 3  # differing ids (or set members) shown per line of the message


@dataclass(frozen=True)
class TokenizerInfo:
    """What a model's tokenizer must agree on. ``pieces[i]``: token id i as spelled in the vocabulary."""

    pieces: Sequence[bytes]
    bos_token_id: int | None
    eos_token_ids: frozenset[int]
    special_ids: frozenset[int]
    add_bos: bool
    chat_template: str | None = None


def _show(piece: bytes | None) -> str:
    return "(none)" if piece is None else repr(piece.decode("utf-8", errors="replace"))


def _show_ids(ids, pieces: Sequence[bytes]) -> str:
    ids = sorted(ids)
    shown = ", ".join(f"{i} {_show(pieces[i]) if 0 <= i < len(pieces) else '(out of range)'}"
                      for i in ids[:MAX_EXAMPLES])
    return f"[{shown}{', ...' if len(ids) > MAX_EXAMPLES else ''}]"


def diff_vocab(pieces_a: Sequence[bytes], pieces_b: Sequence[bytes], names: tuple[str, str] = ("a", "b"),
               max_examples: int = MAX_EXAMPLES) -> list[str]:
    """Differences between two token->id maps, one line each; ``[]`` when they are equal.

    >>> diff_vocab([b"<s>", b"a", b"b"], [b"<s>", b"a", b"b"])
    []
    >>> for line in diff_vocab([b"<s>", b"a", b"b", b"c"], [b"<pad>", b"a", b"x"], ("target", "draft")):
    ...     print(line)
    vocab size: target 4, draft 3
    2 of the 3 shared ids map to different tokens, e.g. id 0: '<s>' vs '<pad>', id 2: 'b' vs 'x'
    """
    a, b = names
    out = []
    if len(pieces_a) != len(pieces_b):
        out.append(f"vocab size: {a} {len(pieces_a)}, {b} {len(pieces_b)}")
    n = min(len(pieces_a), len(pieces_b))
    differ = [i for i in range(n) if pieces_a[i] != pieces_b[i]]
    if differ:
        eg = ", ".join(f"id {i}: {_show(pieces_a[i])} vs {_show(pieces_b[i])}" for i in differ[:max_examples])
        out.append(f"{len(differ)} of the {n} shared ids map to different tokens, e.g. {eg}")
    return out


def diff_tokenizers(ta: TokenizerInfo, tb: TokenizerInfo, names: tuple[str, str] = ("target", "draft"),
                    *, same_pieces: bool = False) -> list[str]:
    """Every difference that makes ``tb`` unfit to draft for ``ta`` (or back), one line each.

    ``same_pieces``: the token->id maps are already known equal (equal fingerprints),
    skip comparing them.

    >>> t = TokenizerInfo([b"<s>", b"</s>", b"a"], 0, frozenset({1}), frozenset({0, 1}), True)
    >>> d = TokenizerInfo([b"<s>", b"</s>", b"a"], 0, frozenset({1, 2}), frozenset({0, 1}), False)
    >>> for line in diff_tokenizers(t, d):
    ...     print(line)
    end-of-generation ids: target [1 '</s>'], draft [1 '</s>', 2 'a']
    add BOS: target True, draft False
    """
    a, b = names
    out = [] if same_pieces else diff_vocab(ta.pieces, tb.pieces, names)

    def tok(i: int | None, pieces) -> str:
        if i is None:
            return "none"
        return f"{i} {_show(pieces[i]) if 0 <= i < len(pieces) else '(out of range)'}"

    if ta.bos_token_id != tb.bos_token_id:
        out.append(f"BOS: {a} {tok(ta.bos_token_id, ta.pieces)}, {b} {tok(tb.bos_token_id, tb.pieces)}")
    if ta.eos_token_ids != tb.eos_token_ids:
        out.append(f"end-of-generation ids: {a} {_show_ids(ta.eos_token_ids, ta.pieces)}, "
                   f"{b} {_show_ids(tb.eos_token_ids, tb.pieces)}")
    if ta.special_ids != tb.special_ids:
        only_a, only_b = ta.special_ids - tb.special_ids, tb.special_ids - ta.special_ids
        parts = [f"{a} has {len(ta.special_ids)}, {b} {len(tb.special_ids)}"]
        if only_a:
            parts.append(f"only {a}'s: {_show_ids(only_a, ta.pieces)}")
        if only_b:
            parts.append(f"only {b}'s: {_show_ids(only_b, tb.pieces)}")
        out.append("control tokens: " + "; ".join(parts))
    if ta.add_bos != tb.add_bos:
        out.append(f"add BOS: {a} {ta.add_bos}, {b} {tb.add_bos}")
    if ta.chat_template and tb.chat_template and ta.chat_template != tb.chat_template:
        out.append(f"chat template: the two models declare different ones "
                   f"({len(ta.chat_template)} vs {len(tb.chat_template)} characters)")
    return out


def chat_template(model_path: str | Path) -> str | None:
    """The chat template a model file declares: ``tokenizer.chat_template`` of a GGUF file,
    ``chat_template`` of a Hugging Face directory's tokenizer_config.json (or its
    chat_template.jinja); None when it declares none or cannot be read."""
    path = Path(model_path)
    try:
        if path.is_file():
            from assistd.targets.gguf_header import gguf_metadata

            value = gguf_metadata(path, {"tokenizer.chat_template"}).get("tokenizer.chat_template")
            return value if isinstance(value, str) else None
        if (path / "chat_template.jinja").is_file():
            return (path / "chat_template.jinja").read_text(encoding="utf-8")
        config = path / "tokenizer_config.json"
        if config.is_file():
            value = json.loads(config.read_text(encoding="utf-8")).get("chat_template")
            return value if isinstance(value, str) else None
    except (OSError, ValueError, ImportError):
        return None
    return None


def tokenizer_info(model: Target, *, with_pieces: bool = True) -> TokenizerInfo:
    """Read what :func:`diff_tokenizers` compares from a loaded model."""
    return TokenizerInfo(
        pieces=model.pieces() if with_pieces else (),
        bos_token_id=model.bos_token_id,
        eos_token_ids=frozenset(model.eos_token_ids),
        special_ids=model.special_ids(),
        add_bos=bool(model.add_bos),
        chat_template=chat_template(model.model_path),
    )


def check_compatible(target: Target, draft: Target) -> None:
    """Raise :class:`ModelError` unless ``draft`` shares ``target``'s tokenizer.

    The message lists every difference (vocabulary size, differing ids with both
    tokens, BOS, end-of-generation ids, control tokens, add-BOS, chat template).
    Equal fingerprints prove equal token->id maps, so the id-by-id comparison only
    runs when they differ.
    """
    same = target.fingerprint == draft.fingerprint
    # Pieces are still needed to name tokens in the message when something else differs.
    ta, tb = tokenizer_info(target), tokenizer_info(draft)
    diffs = diff_tokenizers(ta, tb, ("target", "draft"), same_pieces=same)
    if diffs:
        raise ModelError(
            f"draft model {draft.model_path} cannot draft for target {target.model_path}: "
            f"their tokenizers differ: " + "; ".join(diffs)
            + ". A draft model must share the Target's tokenizer (same model family and "
            "vocabulary); pick a smaller model of the Target's family, or use the ngram proposer"
        )
