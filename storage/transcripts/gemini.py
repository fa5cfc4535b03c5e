"""Gemini CLI chat recordings: ``~/.gemini/tmp/<projectHash>/chats/session-*.json(l)``.

Source: google-gemini/gemini-cli ``packages/core/src/services/chatRecordingService.ts`` and
``chatRecordingTypes.ts``. Two shapes:

- legacy ``session-*.json``: one ``ConversationRecord`` ``{sessionId, projectHash, startTime,
  lastUpdated, messages[]}`` rewritten whole -> ``GeminiJsonParser`` (WholeParser);
- ``session-*.jsonl`` (subagents: ``chats/<parentId>/<id>.jsonl``), append-only ->
  ``GeminiJsonlParser``: a metadata line ``{sessionId, projectHash, ...}``, then
  ``MessageRecord`` lines. ``pushMessage`` re-appends a message IN FULL every time its tool
  calls or tokens change, so the last write of an id wins. ``{"$set": {...}}`` patches
  metadata; ``$set.messages`` (``updateMessagesFromHistory``, after compression or masking)
  carries whole messages, applied here as upserts (earlier records are kept: the model did
  write them). ``{"$rewindTo": id}`` (``rewindTo``) removes that message AND every later one:
  "All messages from (and including) the specified ID onwards are removed".

Model output: messages of ``type`` "gemini": the text parts of ``content`` (a string or a
``PartListUnion``; parts with ``thought: true`` skipped) -> kind assistant, key = message id;
each ``toolCalls[]`` entry -> kind tool_input, key ``<message id>/<call id>``: write_file
``content``, replace ``new_string`` (language from ``file_path``), other tools the JSON of
``args``. ``thoughts`` summaries are skipped; ``inlineData`` and ``thoughtSignature`` are
counted as dropped blobs. The project is only a hash (``projectHash``), so ``cwd`` is None.
With ``context_turns`` on (offline replay), what the model was shown is emitted too
(see ``message_puts``).
"""

from __future__ import annotations

from collections.abc import Iterable

from storage.transcripts.base import (
    ASSISTANT, SYSTEM, TOOL_INPUT, TOOL_RESULT, USER, Head, LineParser, Op, ParseStats, Put,
    Rewind, TranscriptError, WholeParser, WrongType, expect, json_text, register, remember,
    shown_text, text_hash,
)
from assistd.ground.languages import language_id

MESSAGE_TYPES = frozenset({"user", "info", "error", "warning", "gemini"})
EDIT_FIELDS = {"write_file": "content", "replace": "new_string"}
MAX_MESSAGES = 1024  # message ids remembered to resolve $rewindTo
MAX_KEYS = 512       # record keys remembered for last-write-wins dedup


def render_tool_call(name: str, args) -> tuple[str, str | None]:
    """(text, language_id) of one tool call's ``args``. Raises :class:`WrongType` when
    ``args`` is not an object or an edit's text is not a string.

    >>> render_tool_call("replace", {"file_path": "a.ts", "old_string": "x", "new_string": "y"})
    ('y', 'typescript')
    >>> render_tool_call("read_file", {"file_path": "a.ts"})
    ('{"file_path": "a.ts"}', None)
    """
    expect(args, dict, f"the args of {name or 'a tool call'}")
    field = EDIT_FIELDS.get(name)
    if field in args:
        path = args.get("file_path")
        return (expect(args[field], str, f"{name}'s {field}"),
                language_id(path) if isinstance(path, str) and path else None)
    return json_text(args), None


def _result_text(result) -> str:
    """A tool call's ``result`` (a list of ``{functionResponse: {response: {output}}}``)."""
    parts = result if isinstance(result, list) else [result]
    texts = []
    for part in parts:
        fr = part.get("functionResponse") if isinstance(part, dict) else None
        texts.append(shown_text(fr.get("response") if isinstance(fr, dict) else part))
    return "\n".join(t for t in texts if t)


def message_puts(msg: dict, stats: ParseStats, shown: bool = False) -> list[Put]:
    """Records of one MessageRecord (empty for user/info/error/warning).

    ``shown`` (a parser's ``context_turns``): also what the model was shown: user messages
    (kind user), info/error/warning (kind system), each tool call's ``result`` (kind
    tool_result, after the message's own records), under keys ``ctx:...``.
    """
    mtype = msg.get("type")
    if mtype not in MESSAGE_TYPES:
        stats.skipped_unknown += 1
        return []
    if mtype != "gemini":
        text = shown_text(msg.get("content")) if shown else ""
        kind = USER if mtype == "user" else SYSTEM
        return [Put(f"ctx:{msg['id']}", text, kind, None)] if text.strip() else []
    msg_id = str(msg["id"])
    texts: list[str] = []
    calls: dict[str, tuple[str, object]] = {}
    content = msg.get("content")
    parts = content if isinstance(content, list) else [content]
    for i, part in enumerate(parts):
        if isinstance(part, str):
            texts.append(part)
        elif isinstance(part, dict):
            if part.get("inlineData") is not None or part.get("thoughtSignature"):
                stats.dropped_blobs += 1
            if isinstance(part.get("text"), str) and not part.get("thought"):
                texts.append(part["text"])
            call = part.get("functionCall")
            if isinstance(call, dict):  # history-synced content may repeat toolCalls here
                calls[str(call.get("id") or f"{call.get('name')}#{i}")] = (
                    str(call.get("name", "")), call.get("args"))
    tool_calls = msg.get("toolCalls")
    for i, tc in enumerate(tool_calls if isinstance(tool_calls, list) else []):
        if isinstance(tc, dict):
            call_id = str(tc.get("id") or f"{tc.get('name')}#{i}")
            calls[call_id] = (str(tc.get("name", "")), tc.get("args"))
        else:
            stats.skipped_malformed += 1
    puts = []
    text = "".join(texts)
    if text.strip():
        puts.append(Put(msg_id, text, ASSISTANT, None))
    for call_id, (name, args) in calls.items():
        try:
            call_text, lang = render_tool_call(name, args)
        except WrongType:  # this call only: the message's other records stay
            stats.skipped_malformed += 1
            continue
        if call_text.strip():
            puts.append(Put(f"{msg_id}/{call_id}", call_text, TOOL_INPUT, None, lang))
    for i, tc in enumerate(tool_calls if shown and isinstance(tool_calls, list) else []):
        text = _result_text(tc.get("result")) if isinstance(tc, dict) else ""
        if text.strip():
            call_id = str(tc.get("id") or f"{tc.get('name')}#{i}")
            puts.append(Put(f"ctx:{msg_id}/{call_id}", text, TOOL_RESULT, None))
    return puts


def _is_message(value) -> bool:
    return isinstance(value, dict) and isinstance(value.get("id"), str)


@register
class GeminiJsonParser(WholeParser):
    """Legacy single-JSON Gemini CLI session (see module docstring)."""
    format = "gemini_json"
    name_patterns = ("session-*.json",)

    @classmethod
    def sniff(cls, head: Head) -> int:
        whole = head.whole
        if isinstance(whole, dict) and "sessionId" in whole and isinstance(whole.get("messages"), list):
            return 3
        if not head.objects and head.opens_with("{", r'"sessionId"\s*:',
                                                 r'"projectHash"\s*:'):
            return 2
        return 0

    def _parse(self, doc) -> Iterable[Put]:
        if not isinstance(doc, dict) or not isinstance(doc.get("messages"), list):
            raise TranscriptError("not a Gemini CLI session: expected an object with messages[]; "
                                  "check the file or pick another format")
        seen: dict[str, Put] = {}
        for msg in doc["messages"]:
            if not _is_message(msg):
                self.stats.skipped_malformed += 1
                continue
            for put in self._guarded(message_puts, msg, self.stats, self.context_turns):
                if put.key in seen:
                    self.stats.skipped_duplicate += 1
                seen[put.key] = put  # last write wins, first position kept
        return list(seen.values())


@register
class GeminiJsonlParser(LineParser):
    """Append-only Gemini CLI session log (see module docstring)."""
    format = "gemini_jsonl"
    name_patterns = ("session-*.jsonl", "*.jsonl")
    state_fields = ("order", "hashes")

    def __init__(self) -> None:
        super().__init__()
        self.order: list[list] = []          # [message id, [record keys]] in first-write order
        self.hashes: dict[str, str] = {}     # record key -> hash of its last emitted text

    @classmethod
    def sniff(cls, head: Head) -> int:
        for obj in head.objects:
            if "$rewindTo" in obj or isinstance(obj.get("$set"), dict):
                return 3
            if "sessionId" in obj and "projectHash" in obj and "messages" not in obj:
                return 3
        return 0

    def _feed(self, line: str) -> list[Op]:
        rec = self._json(line)
        if rec is None:
            return []
        if isinstance(rec.get("$rewindTo"), str):
            return self._rewind(rec["$rewindTo"])
        if _is_message(rec):
            return self._message(rec)
        if "$set" in rec:
            patch = rec["$set"]
            if not isinstance(patch, dict):
                self.stats.skipped_malformed += 1
                return []
            ops: list[Op] = []
            messages = patch.get("messages")
            for msg in messages if isinstance(messages, list) else []:
                if _is_message(msg):
                    ops.extend(self._message(msg))
                else:
                    self.stats.skipped_malformed += 1
            return ops
        if "sessionId" in rec:
            return []  # the metadata line
        self.stats.skipped_unknown += 1
        return []

    def _entry(self, msg_id: str) -> list:
        for entry in reversed(self.order):
            if entry[0] == msg_id:
                return entry
        entry = [msg_id, []]
        self.order.append(entry)
        if len(self.order) > MAX_MESSAGES:
            for key in self.order.pop(0)[1]:
                self.hashes.pop(key, None)
        return entry

    def _message(self, msg: dict) -> list[Op]:
        entry = self._entry(str(msg["id"]))
        ops: list[Op] = []
        for put in message_puts(msg, self.stats, self.context_turns):
            h = text_hash(put.kind, put.text, put.language_id or "")
            if self.hashes.get(put.key) == h:
                self.stats.skipped_duplicate += 1  # an unchanged re-write of the message
                continue
            remember(self.hashes, put.key, h, MAX_KEYS)
            if put.key not in entry[1]:
                entry[1].append(put.key)
            ops.append(put)
        return ops

    def _rewind(self, msg_id: str) -> list[Op]:
        index = next((i for i, e in enumerate(self.order) if e[0] == msg_id), None)
        if index is None:
            # gemini-cli's reader clears everything for an unknown id, but its writer only
            # logs ids it holds: unknown here means older than our window. Keep the records.
            self.stats.skipped_unknown += 1
            return []
        dropped = self.order[index:]
        del self.order[index:]
        first = next((keys[0] for _, keys in dropped if keys), None)
        for _, keys in dropped:
            for key in keys:
                self.hashes.pop(key, None)
        return [Rewind(first)] if first is not None else []
