"""Rewrite cases from agent transcripts (:func:`transcript_cases`): Claude Code
``Edit``/``MultiEdit``/``Write`` calls and Codex ``apply_patch`` calls whose file text
before the edit the transcript itself holds (a tool result's ``originalFile``, an
earlier full read of the file, or the file as an earlier edit left it). The instruction
is the user's latest request. Cases, windows and filters as in
:mod:`assistd.measure.rewrite_cases` (the git source).
"""

from __future__ import annotations

import posixpath
import re
import shlex
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from assistd.ground.languages import language_id
from assistd.measure.rewrite_cases import MAX_CHANGED, RewriteCase, _lines, cut
from storage.transcripts.base import loads
from storage.transcripts.codex import render_command
from storage.transcripts.detect import open_bytes


# ------------------------------------------------------------------- transcripts: shared

def _apply_replace(text: str, old: str, new: str, replace_all: bool) -> str | None:
    """Claude Code's Edit on ``text``: None unless ``old`` is non-empty and occurs exactly
    once (or, with ``replace_all``, at least once)."""
    count = text.count(old) if old else 0
    if count == 0 or (count > 1 and not replace_all):
        return None
    return text.replace(old, new)


def _request_text(content) -> str | None:
    """A user's own words in a message ``content`` (a str, or a list of text blocks), or
    None for tool results and client-injected text (``<system-reminder>``, ``<command-…>``,
    ``<environment_context>``, AGENTS.md instructions, interruption notices)."""
    if isinstance(content, str):
        parts = [content]
    elif isinstance(content, list):
        if any(isinstance(b, dict) and b.get("type") == "tool_result" for b in content):
            return None
        parts = [b.get("text") for b in content if isinstance(b, dict)
                 and b.get("type") in ("text", "input_text") and isinstance(b.get("text"), str)]
    else:
        return None
    parts = [p.strip() for p in parts if p.strip() and not p.strip().startswith(
        ("<", "# AGENTS.md", "[Request interrupted"))]
    return "\n\n".join(parts) or None


def _records(path: Path) -> Iterator[tuple[int, dict]]:
    """(line number from 1, JSON object) of each line of a JSONL transcript (zstd or
    plain). Lines that are not UTF-8 or not a JSON object (truncated, too deep) are
    skipped."""
    for n, raw in enumerate(open_bytes(path).split(b"\n"), 1):
        if not raw.strip():
            continue
        try:
            obj = loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            continue
        if isinstance(obj, dict):
            yield n, obj


@dataclass(frozen=True)
class _Edit:
    """An edit whose tool call succeeded: the file text before it and after it."""
    path: str
    before: str
    after: str
    instruction: str


# ------------------------------------------------------------------- Claude Code

_NUMBERED = re.compile(r"^ *(\d+)(?:→|\t)(.*)$")  # Read's "     1→text" (older: cat -n's tab)
READ_MAX_LINES = 2000  # Claude Code's Read default limit: a longer file comes back cut


def read_output_text(output: str) -> str | None:
    """The file text of a whole-file Claude Code ``Read`` result (``"     1→text"`` lines,
    numbered from 1, then possibly a ``<system-reminder>``), or None when it is not
    numbered from 1 without gaps or may be cut (READ_MAX_LINES lines). The output does not
    say whether the file ended with a newline: one is assumed (a POSIX text file).

    >>> read_output_text("     1→def f():\\n     2→    return 1\\n")
    'def f():\\n    return 1\\n'
    """
    lines = []
    for line in output.split("\n"):
        m = _NUMBERED.match(line)
        if not m:
            break
        if int(m.group(1)) != len(lines) + 1:
            return None
        lines.append(m.group(2))
    if not lines or len(lines) >= READ_MAX_LINES:
        return None
    return "\n".join(lines) + "\n"


def _tool_result_text(block: dict) -> str | None:
    content = block.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = [b.get("text") for b in content if isinstance(b, dict) and b.get("type") == "text"]
        if texts and all(isinstance(t, str) for t in texts):
            return "\n".join(texts)
    return None


def _claude_read(call: dict, block: dict, result) -> str | None:
    """The whole file text a successful Read call returned, or None (a partial read)."""
    if isinstance(result, dict) and isinstance(result.get("file"), dict):
        f = result["file"]
        if (isinstance(f.get("content"), str) and f.get("startLine") in (None, 1)
                and isinstance(f.get("numLines"), int)
                and f.get("numLines") == f.get("totalLines")):
            return f["content"]
    if call.get("offset") not in (None, 0, 1) or call.get("limit") is not None:
        return None
    text = _tool_result_text(block)
    return read_output_text(text) if text is not None else None


def _claude_edit(name: str, call: dict, before: str | None) -> str | None:
    """The file text after an Edit/MultiEdit/Write call on ``before``, or None."""
    if name == "Write":
        return call.get("content") if isinstance(call.get("content"), str) else None
    if before is None:
        return None
    edits = [call] if name == "Edit" else call.get("edits")
    if not isinstance(edits, list) or not edits:
        return None
    text = before
    for e in edits:
        if not (isinstance(e, dict) and isinstance(e.get("old_string"), str)
                and isinstance(e.get("new_string"), str)):
            return None
        text = _apply_replace(text, e["old_string"], e["new_string"], e.get("replace_all") is True)
        if text is None:
            return None
    return text


def claude_code_edits(path: Path) -> Iterator[tuple[int, _Edit]]:
    """(line number of the tool_use, edit) of a Claude Code session's successful file
    edits whose text before the edit it holds.

    The before text is the Edit result's ``toolUseResult.originalFile`` when present,
    else the file as the session last saw it: a whole-file ``Read`` (toolUseResult's
    ``file`` with startLine 1 and all lines, or the numbered output of a Read without
    offset/limit) or the result of an earlier edit of the file. Skipped: calls whose
    result is an error or never comes, ``old_string`` empty (file creation) or not found
    exactly once (unless ``replace_all``), Writes of a file not seen before. The
    instruction is the latest user request (else the assistant's latest text).
    """
    known: dict[str, str] = {}  # file_path -> its text as the session last saw it
    pending: dict[str, tuple[int, str, dict, str]] = {}
    request = said = None
    for n, rec in _records(path):
        message = rec.get("message")
        if not isinstance(message, dict):
            continue
        content = message.get("content")
        if rec.get("type") == "assistant" and isinstance(content, list):
            for block in content:
                if not isinstance(block, dict):
                    continue
                if block.get("type") == "text" and isinstance(block.get("text"), str) \
                        and block["text"].strip():
                    said = block["text"].strip()
                elif (block.get("type") == "tool_use" and isinstance(block.get("id"), str)
                      and isinstance(block.get("input"), dict)
                      and isinstance(block["input"].get("file_path"), str)):
                    pending[block["id"]] = (n, str(block.get("name")), block["input"],
                                            request or said or "")
        elif rec.get("type") == "user":
            if not rec.get("isMeta") and (text := _request_text(content)) is not None:
                request, said = text, None
                continue
            if not isinstance(content, list):
                continue
            for block in content:
                if not (isinstance(block, dict) and block.get("type") == "tool_result"
                        and block.get("tool_use_id") in pending):
                    continue
                line, name, call, instruction = pending.pop(block["tool_use_id"])
                if block.get("is_error"):
                    continue
                file_path, result = call["file_path"], rec.get("toolUseResult")
                if name == "Read":
                    text = _claude_read(call, block, result)
                    if text is not None:
                        known[file_path] = text
                    continue
                if name not in ("Edit", "MultiEdit", "Write"):
                    continue
                before = known.get(file_path)
                if isinstance(result, dict) and isinstance(result.get("originalFile"), str):
                    before = result["originalFile"]
                after = _claude_edit(name, call, before)
                if after is None:
                    known.pop(file_path, None)  # the file changed in a way we cannot follow
                    continue
                known[file_path] = after
                if before is not None and instruction:
                    yield line, _Edit(file_path, before, after, instruction)


# ------------------------------------------------------------------------- Codex

_PATCH_FILE = re.compile(r"^\*\*\* (Update|Add|Delete) File: (.+)$")
_SED_RANGE = re.compile(r"^1,(\d+)p$")


def _codex_output(output) -> tuple[int | None, str] | None:
    """(exit code or None when not said, text) of a Codex tool output: the unified exec
    text (``Process exited with code N`` ... ``Output:\\n<text>``), the older JSON
    ``{"output", "metadata": {"exit_code"}}``, or plain text. None when cut (Codex's
    ``tokens truncated`` / ``omitted`` markers) or not text."""
    if isinstance(output, dict):
        output = output.get("content") if isinstance(output.get("content"), str) else None
    if not isinstance(output, str):
        return None
    code = None
    try:
        obj = loads(output)  # bounded nesting: the output is untrusted
    except ValueError:
        obj = None
    if isinstance(obj, dict) and isinstance(obj.get("output"), str):
        meta = obj.get("metadata")
        code = meta.get("exit_code") if isinstance(meta, dict) else None
        text = obj["output"]
    else:
        head, sep, text = output.partition("\nOutput:\n")
        if not sep:
            text = output
        elif m := re.search(r"(?:Process exited with code|Exit code:) (-?\d+)", head):
            code = int(m.group(1))
    if re.search(r"tokens truncated|chars truncated|\[\.\.\. omitted", text):
        return None
    return code, text


def _read_command(command: str | None) -> tuple[str, int | None] | None:
    """(file, line bound or None) for ``cat FILE`` and ``sed -n '1,Np' FILE``, else None."""
    try:
        argv = shlex.split(command or "")
    except ValueError:
        return None
    if len(argv) == 2 and argv[0] == "cat" and not argv[1].startswith("-"):
        return argv[1], None
    if len(argv) == 4 and argv[:2] == ["sed", "-n"] and (m := _SED_RANGE.match(argv[2])):
        return argv[3], int(m.group(1))
    return None


def _patch_command(command: str | None) -> str | None:
    """The patch of a shell call that runs apply_patch (``apply_patch <<'EOF'`` heredoc)."""
    if not command:
        return None
    m = re.match(r"^\s*apply_patch\s+<<\s*['\"]?(\w+)['\"]?\n(.*)\n\1\s*$", command, re.S)
    return m.group(2) + "\n" if m else None


def parse_patch(patch: str) -> list[tuple[str, str, list]] | None:
    """A Codex apply_patch text as (op, path, body) per file: op Update/Add/Delete; an
    Update's body is its hunks [(context line or None, old lines, new lines, at end of
    file)], an Add's the file's lines. None when it is not a patch or holds a move
    (``*** Move to:``), which this reader leaves out."""
    lines = patch.strip("\n").split("\n")
    if (len(lines) < 2 or lines[0].strip() != "*** Begin Patch"
            or lines[-1].strip() != "*** End Patch"):
        return None
    files: list[tuple[str, str, list]] = []
    for line in lines[1:-1]:
        if m := _PATCH_FILE.match(line):
            files.append((m.group(1), m.group(2).strip(), []))
        elif not files or line.startswith("*** Move to:"):
            return None
        elif files[-1][0] == "Add":
            if not line.startswith("+"):
                return None
            files[-1][2].append(line[1:])
        elif files[-1][0] == "Update":
            hunks = files[-1][2]
            if line.startswith("@@"):
                hunks.append([line[2:].strip() or None, [], [], False])
            elif line.strip() == "*** End of File":
                if not hunks:
                    return None
                hunks[-1][3] = True
            else:
                if not hunks:  # a first hunk may start without "@@"
                    hunks.append([None, [], [], False])
                mark, rest = (line[:1], line[1:]) if line else (" ", "")
                if mark not in " -+":
                    return None
                if mark in " -":
                    hunks[-1][1].append(rest)
                if mark in " +":
                    hunks[-1][2].append(rest)
        else:
            return None
    return files


def _find(lines: list[str], seq: list[str], start: int) -> int | None:
    for i in range(start, len(lines) - len(seq) + 1):
        if lines[i:i + len(seq)] == seq:
            return i
    return None


def apply_update(before: str, hunks: list) -> str | None:
    """An Update File's hunks applied to ``before`` as Codex does, with exact matches
    only: each hunk's ``@@`` context line is found first, then its old lines from there
    (at the end of the file when marked so); the result ends with a newline. None when a
    hunk does not match exactly or only adds lines (Codex puts those at the file's end,
    whatever the context: left out as ambiguous)."""
    lines = before.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    out, cursor = [], 0
    for context, old, new, at_eof in hunks:
        if not old:
            return None
        if context is not None:
            at = _find(lines, [context], cursor)
            if at is None:
                return None
            out.extend(lines[cursor:at + 1])
            cursor = at + 1
        at = len(lines) - len(old) if at_eof else _find(lines, old, cursor)
        if at is None or at < cursor or lines[at:at + len(old)] != old:
            return None
        out.extend(lines[cursor:at])
        out.extend(new)
        cursor = at + len(old)
    out.extend(lines[cursor:])
    return "\n".join(out) + "\n"


def _codex_call(item: dict) -> tuple[str, str, str | None] | None:
    """(call id, "patch"|"read", the patch or the command's workdir-relative form) of a
    Codex tool call, or None for calls that neither edit nor read a whole file."""
    call_id = item.get("call_id")
    if not isinstance(call_id, str):
        return None
    if item.get("type") == "custom_tool_call":
        if item.get("name") == "apply_patch" and isinstance(item.get("input"), str):
            return call_id, "patch", item["input"]
        return None
    args = item.get("arguments")
    if item.get("type") == "local_shell_call":
        action = item.get("action")
        args = {"command": action.get("command")} if isinstance(action, dict) else None
    elif isinstance(args, str):
        try:
            args = loads(args)
        except ValueError:
            return None
    if not isinstance(args, dict):
        return None
    if item.get("name") == "apply_patch" and isinstance(args.get("input"), str):
        return call_id, "patch", args["input"]
    raw = args.get("cmd", args.get("command"))
    if (isinstance(raw, list) and len(raw) == 2 and raw[0] == "apply_patch"
            and isinstance(raw[1], str)):
        return call_id, "patch", raw[1]
    command = render_command(raw)
    if (patch := _patch_command(command)) is not None:
        return call_id, "patch", patch
    return call_id, "read", command


def codex_edits(path: Path) -> Iterator[tuple[int, _Edit]]:
    """(line number of the call, edit) of a Codex rollout's successful apply_patch
    Update File edits whose file text before the patch it holds: the output of an earlier
    ``cat FILE`` or ``sed -n '1,Np' FILE`` that printed fewer than N lines (so the whole
    file), exit code 0 and not cut, or the file as an earlier patch of this rollout left
    it (Add File included). Paths are resolved against the call's ``workdir`` or the
    session's cwd. Skipped: patches whose output is missing or not a success, moves,
    hunks that do not match exactly or only add lines. The instruction is the user's
    latest request.
    """
    known: dict[str, str] = {}  # resolved path -> text
    pending: dict[str, tuple[int, str, object, str, str]] = {}
    cwd, request = "/", ""
    for n, rec in _records(path):
        payload = rec.get("payload")
        if not isinstance(payload, dict):
            continue
        kind, item = rec.get("type"), payload.get("type")
        if kind in ("session_meta", "turn_context") and isinstance(payload.get("cwd"), str):
            cwd = payload["cwd"]
        elif (kind == "event_msg" and item == "user_message"
              and isinstance(payload.get("message"), str)):
            request = _request_text(payload["message"]) or request
        elif kind != "response_item":
            continue
        elif item == "message" and payload.get("role") == "user":
            request = _request_text(payload.get("content")) or request
        elif item in ("function_call", "custom_tool_call", "local_shell_call"):
            call = _codex_call(payload)
            if call is None:
                continue
            call_id, what, arg = call
            workdir = cwd
            args = payload.get("arguments")
            if isinstance(args, str) and '"workdir"' in args:
                try:
                    wd = loads(args).get("workdir")
                except (ValueError, AttributeError):
                    wd = None
                if isinstance(wd, str):
                    workdir = posixpath.join(cwd, wd)
            if what == "read":
                target = _read_command(arg)
                if target is None:
                    continue
                arg = (posixpath.normpath(posixpath.join(workdir, target[0])), target[1])
            pending[call_id] = (n, what, arg, workdir, request)
        elif item in ("function_call_output", "custom_tool_call_output") \
                and payload.get("call_id") in pending:
            line, what, arg, workdir, instruction = pending.pop(payload["call_id"])
            result = _codex_output(payload.get("output"))
            if result is None:
                continue
            code, text = result
            if what == "read":
                file, bound = arg
                if code == 0 and (bound is None or len(_lines(text)) < bound):
                    known[file] = text
                continue
            if code not in (0, None) or (code is None and not text.startswith("Success")):
                continue
            files = parse_patch(arg)
            for op, name, body in files or []:
                file = posixpath.normpath(posixpath.join(workdir, name))
                if op == "Add":
                    known[file] = "\n".join(body) + "\n"
                elif op == "Delete":
                    known.pop(file, None)
                else:
                    before = known.pop(file, None)
                    after = apply_update(before, body) if before is not None else None
                    if after is None:
                        continue
                    known[file] = after
                    if instruction:
                        yield line, _Edit(name, before, after, instruction)


# ------------------------------------------------------------------- transcript cases

def _sniff_source(path: Path) -> str | None:
    """claude-code or codex from a transcript's first JSON objects, else None."""
    for i, (_, rec) in enumerate(_records(path)):
        if isinstance(rec.get("payload"), dict) and rec.get("type") in (
                "session_meta", "response_item", "turn_context", "event_msg"):
            return "codex"
        if rec.get("type") in ("user", "assistant") and isinstance(rec.get("message"), dict):
            return "claude-code"
        if i >= 50:
            break
    return None


def transcript_cases(paths: Iterable[Path], *, limit: int = 12, max_chars: int = 6000,
                     window: int | None = 30,
                     max_changed: float = MAX_CHANGED) -> list[RewriteCase]:
    """Up to ``limit`` rewrite cases from Claude Code sessions and Codex rollouts
    (``.jsonl``, plain or zstd; the format is read from the records), in the order of
    ``paths`` then of each file. See :func:`claude_code_edits` and :func:`codex_edits`
    for what each gives and skips, and :func:`cut` for ``window``/``max_chars``/
    ``max_changed``. Files of other formats, and lines that are not JSON objects, give
    nothing. Raises OSError for a file that cannot be read."""
    cases: list[RewriteCase] = []
    for path in paths:
        path = Path(path)
        source = _sniff_source(path)
        if source is None:
            continue
        edits = claude_code_edits(path) if source == "claude-code" else codex_edits(path)
        count = 0
        for _, edit in edits:
            if len(cases) >= limit:
                return cases
            pair = cut(edit.before, edit.after, window=window, max_chars=max_chars,
                       max_changed=max_changed)
            if pair is None:
                continue
            count += 1
            cases.append(RewriteCase(
                name=f"{source}:{path.name}:{count}", path=edit.path,
                language=language_id(edit.path), before=pair[0], after=pair[1],
                instruction=edit.instruction, source=source))
    return cases
