"""The model's part of fast apply: the prompt that merges a lazy snippet, and its answer.

A lazy snippet (``// ... existing code ...``) cannot be applied by rule: something must
decide where its lines go. The model is asked for the complete updated file inside one
code fence, and it is given the original file as its predicted output (OpenAI's
Predicted Outputs): most of the answer copies the file, so most of it is drafted from
the prediction and verified in batches, not decoded token by token.
:func:`prediction_text` is that prediction, spelled exactly as an unchanged answer
would be (the fence included), so the draft lines up with the answer from its first
token. The prediction makes copying cheap, never right: verification keeps the Target's
own greedy answer. So the answer is checked by rule (:func:`merge_warnings`) and the
blank lines a small model squeezes are put back (:func:`restore_blank_lines`).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from assistd.edits.blocks import lazy_markers
from assistd.ground.errors import InputError

SYSTEM = (
    "You merge an edit into a source file. You are given the file and an edit snippet"
    " that shows only the changed code; comments such as '... existing code ...' stand"
    " for unchanged lines of the file. Reply with the complete updated file and nothing"
    " else, inside one code fence: every line the snippet does not change copied"
    " exactly, the snippet's changes put where they belong, and no elision comments"
    " left in.")
_FENCE_RE = re.compile(r"^(`{3,}|~{3,})[^`]*$")


@dataclass(frozen=True)
class MergeJob:
    """What a model callable gets for one merge. ``messages``: the chat
    (:func:`merge_prompt`); ``prediction``: the predicted output text
    (:func:`prediction_text`). The callable tokenizes both, so it also sizes the answer
    (:func:`answer_budget`). The other fields are for a caller with a prompt of its own."""

    path: str
    language: str
    original: str
    snippet: str
    instruction: str
    messages: list[dict]
    prediction: str


@dataclass(frozen=True)
class ModelRewrite:
    """A model callable's answer: ``text``, the assistant message as generated (the
    fenced file; :func:`extract_code` takes the file out); ``usage``: its counts as the
    engine reports them (OpenAI's names: ``prompt_tokens``, ``completion_tokens``,
    ``accepted_prediction_tokens``, ``rejected_prediction_tokens``, ...)."""

    text: str
    usage: dict = field(default_factory=dict)


# (job) -> answer; the daemon's or the in-process Runtime's chat with prediction=.
ModelFn = Callable[[MergeJob], ModelRewrite]


def fence_for(*texts: str) -> str:
    """A backtick fence longer than any run of backticks at a line start in ``texts``
    (at least three), so a file holding fences of its own stays inside one.

    >>> fence_for("x = 1"), fence_for("```py\\nx\\n```")
    ('```', '````')
    """
    longest = max((len(m.group(1)) for t in texts
                   for m in re.finditer(r"^\s*(`{3,})", t, re.MULTILINE)), default=0)
    return "`" * max(3, longest + 1)


def _fenced(fence: str, language: str, text: str) -> str:
    tag = "" if language == "plaintext" else language
    return f"{fence}{tag}\n{text}{'' if text.endswith(chr(10)) or not text else chr(10)}{fence}"


def prediction_text(language: str, original: str, snippet: str = "") -> str:
    """The answer the model would give if the edit changed nothing: ``original`` in the
    fence :func:`merge_prompt` asks for (the predicted output)."""
    return _fenced(fence_for(original, snippet), language, original)


def merge_prompt(path: str, language: str, original: str, snippet: str,
                 instruction: str = "") -> list[dict]:
    """The chat messages ``[{"role", "content"}]`` (system, user) that ask for the
    complete updated file only, inside one code fence. ``path``: the file as the agent
    named it (relative to its repository); ``language``: its LSP language id;
    ``instruction``: the agent's one-line intent ("add error handling"), optional."""
    fence = fence_for(original, snippet)
    parts = [f"File {path}:", _fenced(fence, language, original)]
    if instruction.strip():
        parts.append(f"Instruction: {instruction.strip()}")
    parts += ["Edit snippet:", _fenced(fence, language, snippet),
              f"Write the complete updated {path} in one {fence} fence."]
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "\n\n".join(parts)}]


def extract_code(text: str) -> str:
    """The file out of a model's answer: the body of its first code fence (``` or ~~~,
    any info string), closed by a fence line of the same character at least as long.
    An answer with no fence at all is taken whole. The body ends in a newline.

    Raises :class:`InputError` when a fence opens and never closes (the answer was cut
    off, e.g. at max_tokens): a partial file must not pass for the whole one.

    >>> extract_code("Here:\\n```python\\nx = 1\\n```\\nDone.")
    'x = 1\\n'
    """
    lines = text.split("\n")
    for i, line in enumerate(lines):
        m = _FENCE_RE.match(line.strip())
        if not m:
            continue
        fence = m.group(1)
        for j in range(i + 1, len(lines)):
            s = lines[j].strip()
            if s and set(s) == {fence[0]} and len(s) >= len(fence):
                body = lines[i + 1:j]
                return "\n".join(body) + ("\n" if body else "")
        raise InputError("the model's answer opens a code fence and never closes it (cut off"
                         " at its token limit?); the file was not merged")
    return text if text.endswith("\n") or not text else text + "\n"


def answer_budget(original_tokens: int, snippet_tokens: int) -> int:
    """Tokens to allow the merged answer: the file, the snippet's additions, the fence,
    and a margin (the merged file is rarely longer than both together)."""
    return original_tokens + snippet_tokens + 16 + original_tokens // 8


def merge_warnings(original: str, snippet: str, merged: str, language: str) -> list[str]:
    """What looks wrong in a model's merge without being an error, checked by rule: the
    file given back unchanged, code lines of the snippet (elision lines aside) missing
    from the result, elision comments left in it, half the file gone, or (where the
    snippet elides code) original lines gone that the snippet does not replace.

    >>> merge_warnings("a = 1\\n", "# ...\\nb = 2\\n", "a = 1\\n", "python")
    ['the model gave the file back unchanged: the snippet was not merged']
    """
    out = []
    elided = {n for n, _ in lazy_markers(snippet, language)}
    code = [line.strip() for n, line in enumerate(snippet.splitlines(), 1)
            if line.strip() and n not in elided]
    present = {line.strip() for line in merged.splitlines()}
    missing = [line for line in code if line not in present]
    if merged == original:
        out.append("the model gave the file back unchanged: the snippet was not merged")
    elif missing:
        out.append(f"{len(missing)} of the snippet's {len(code)} code lines are not in the"
                   f" merged file (first: {missing[0][:60]!r}): the merge looks wrong")
    had = {t for _, t in lazy_markers(original, language)}
    left = [t for _, t in lazy_markers(merged, language) if t not in had]
    if left:
        out.append(f"the merged file still holds elision comments ({left[0]!r}): the model"
                   " did not fill them in")
    n_old, n_new = original.count("\n"), merged.count("\n")
    if n_old >= 10 and n_new < n_old // 2:
        out.append(f"the merged file has {n_new} lines, the original {n_old}: the model may"
                   " have dropped code")
    elif elided:
        # An elision says "keep this code": original code lines that are neither in the
        # result nor in the snippet were dropped, past the ones the snippet's own lines
        # may have replaced (at most one each).
        kept = present | set(code)
        dropped = [line.strip() for line in original.splitlines()
                   if line.strip() and line.strip() not in kept]
        if len(dropped) > len(code):
            out.append(f"{len(dropped)} code lines of the original are gone though the snippet"
                       f" elides unchanged code (first: {dropped[0][:60]!r}): the model may"
                       " have dropped code")
    return out


def restore_blank_lines(original: str, merged: str) -> tuple[str, int]:
    """``merged`` with the runs of blank lines that it dropped from ``original`` put back,
    and how many lines that was. Small models copy a file but squeeze its blank lines
    (PEP 8's two between functions become one); a lazy snippet never asks for that, so
    a deletion of blank lines only is undone. Lines are aligned with difflib (no junk
    heuristic: blank lines are the point).

    >>> restore_blank_lines("a\\n\\n\\nb\\n", "a\\n\\nb = 2\\n")
    ('a\\n\\n\\nb = 2\\n', 1)
    """
    a, b = _split(original), _split(merged)
    out, restored = [], 0
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        old, new = a[i1:i2], b[j1:j2]
        if tag == "delete" and not any(line.strip() for line in old):
            out += old
            restored += len(old)
        elif tag == "replace" and any(line.strip() for line in old):
            # the blank lines at either end of a changed run: as many as the original had
            front = max(0, _blanks(old) - _blanks(new))
            back = max(0, _blanks(old[::-1]) - _blanks(new[::-1]))
            out += old[:front] + new + old[len(old) - back:]
            restored += front + back
        else:
            out += new
    text = "\n".join(out)
    return (text + "\n" if out and merged.endswith("\n") else text), restored


def _split(text: str) -> list[str]:
    """Lines without their newlines (a final newline makes no empty last line)."""
    return text.split("\n")[:-1] if text.endswith("\n") else text.split("\n") if text else []


def _blanks(lines: list[str]) -> int:
    """How many blank lines ``lines`` starts with."""
    n = 0
    while n < len(lines) and not lines[n].strip():
        n += 1
    return n
