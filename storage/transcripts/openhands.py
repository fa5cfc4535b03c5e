"""OpenHands (V0) event trajectories: a JSON array of events, rewritten whole.

Source: All-Hands-AI/OpenHands ``openhands/events/serialization/event.py`` (``event_to_dict``)
``openhands/core/schema/action.py`` (action names) and ``openhands/events/action/*.py``
(fields). An event is ``{id, timestamp, source, action|observation, message, args|extras,
tool_call_metadata}``; ``{"history": [...]}`` / ``{"events": [...]}`` wrappers are accepted.

Model output, from events with ``source: "agent"`` and an ``action``:

- ``args.thought`` -> kind assistant, key ``event<id>/thought``;
- ``message``: ``args.content``; ``finish``: ``args.final_thought`` -> kind assistant,
  key ``event<id>``;
- ``run``: ``args.command`` (shellscript); ``run_ipython``: ``args.code`` (python);
  ``write``: ``args.content``; ``edit``: ``file_text``/``new_str``/``content`` (language from
  ``path``), and when the event stores none of them (older serializations keep only
  ``translated_ipython_code``) the same field from the tool call's arguments in
  ``tool_call_metadata.model_response``; ``browse_interactive``: ``browser_actions``;
  ``call_tool_mcp``: the JSON of ``arguments`` -> kind tool_input, key ``event<id>``.

Observations, user/environment events and the ``message`` display strings are not model
output. OpenHands does not record the host project directory, so ``cwd`` is None.
With ``context_turns`` on (offline replay), what the model was shown is emitted too
(see ``_shown``).
"""

from __future__ import annotations

from collections.abc import Iterable

from storage.transcripts.base import (
    ASSISTANT, SYSTEM, TOOL_INPUT, TOOL_RESULT, USER, Head, Put, TranscriptError, WholeParser,
    expect, json_text, loads, register, shown_text,
)
from assistd.ground.languages import language_id

KNOWN_ACTIONS = frozenset({
    "message", "start", "read", "write", "edit", "run", "run_ipython", "browse",
    "browse_interactive", "delegate", "think", "finish", "reject", "null", "summarize", "pause",
    "resume", "stop", "change_agent_state", "push", "send_pr", "recall", "search", "system",
    "call_tool_mcp", "mcp", "condensation", "condensation_request", "task_tracking",
    "loop_recovery",
})
EDIT_FIELDS = ("file_text", "new_str", "content")


def _tool_call_args(event: dict) -> dict:
    """The arguments the model gave for this event's tool call, if recorded."""
    meta = event.get("tool_call_metadata")
    if not isinstance(meta, dict):
        return {}
    try:
        choices = meta["model_response"]["choices"]
        calls = choices[0]["message"]["tool_calls"]
    except (KeyError, IndexError, TypeError):
        return {}
    for call in calls if isinstance(calls, list) else []:
        if isinstance(call, dict) and call.get("id") == meta.get("tool_call_id"):
            try:
                args = loads(call["function"]["arguments"])
            except (KeyError, TypeError, ValueError):  # TooDeep is a ValueError
                return {}
            return args if isinstance(args, dict) else {}
    return {}


def _first_str(d: dict, names) -> str | None:
    for name in names:
        if isinstance(d.get(name), str) and d[name].strip():
            return d[name]
    return None


@register
class OpenHandsParser(WholeParser):
    """OpenHands event array (see module docstring)."""
    format = "openhands"
    name_patterns = ("*.json",)

    @classmethod
    def sniff(cls, head: Head) -> int:
        whole = head.whole
        if isinstance(whole, dict):
            whole = whole.get("history") or whole.get("events")
        if isinstance(whole, list) and whole and all(isinstance(e, dict) for e in whole) \
                and any(("action" in e or "observation" in e) and "source" in e for e in whole):
            return 3
        if head.opens_with("[", r'"(action|observation)"\s*:',
                           r'"source"\s*:\s*"(agent|user|environment)"'):
            return 2
        return 0

    def _parse(self, doc) -> Iterable[Put]:
        events = doc.get("history", doc.get("events")) if isinstance(doc, dict) else doc
        if not isinstance(events, list):
            raise TranscriptError("not an OpenHands trajectory: expected a JSON array of events; "
                                  "check the file or pick another format")
        puts: list[Put] = []
        for i, event in enumerate(events):
            puts.extend(self._guarded(self._event, event, i))
        return puts

    def _event(self, event, i: int) -> list[Put]:
        """Records of one event (``i``: its index, the key when it has no id)."""
        if not isinstance(event, dict):
            self.stats.skipped_malformed += 1
            return []
        if "observation" in event:
            return self._shown(event, TOOL_RESULT, event.get("content"), i) \
                if self.context_turns else []
        action = event.get("action")
        if action is None or action not in KNOWN_ACTIONS:  # a list here raises: the event is bad
            self.stats.skipped_unknown += 1
            return []
        args = event.get("args") if isinstance(event.get("args"), dict) else {}
        if self.context_turns and action == "system":
            return self._shown(event, SYSTEM, args.get("content"), i)
        if event.get("source") != "agent":
            if self.context_turns and action == "message":
                return self._shown(event, USER, args.get("content"), i)
            return []
        return self._action(event, action, f"event{event.get('id', i)}")

    @staticmethod
    def _shown(event: dict, kind: str, content, i: int) -> list[Put]:
        """Context turns (``context_turns`` only): observations' ``content`` (kind
        tool_result), the system prompt (kind system), users' messages (kind user)."""
        text = shown_text(content)
        return [Put(f"ctx:event{event.get('id', i)}", text, kind, None)] if text.strip() else []

    def _action(self, event: dict, action: str, key: str) -> list[Put]:
        args = event.get("args") if isinstance(event.get("args"), dict) else {}
        puts = []
        thought = args.get("thought")
        if isinstance(thought, str) and thought.strip():
            puts.append(Put(f"{key}/thought", thought, ASSISTANT, None))
        said = {"message": "content", "finish": "final_thought"}.get(action)
        if said and isinstance(args.get(said), str) and args[said].strip():
            puts.append(Put(key, args[said], ASSISTANT, None))
        text, lang = None, None
        if action == "run":
            text, lang = _first_str(args, ("command",)), "shellscript"
        elif action == "run_ipython":
            text, lang = _first_str(args, ("code",)), "python"
        elif action in ("write", "edit"):
            fields = ("content",) if action == "write" else EDIT_FIELDS
            text = _first_str(args, fields) or _first_str(_tool_call_args(event), fields)
            path = args.get("path")
            lang = language_id(path) if isinstance(path, str) and path else None
        elif action == "browse_interactive":
            text = _first_str(args, ("browser_actions",))
        elif action in ("call_tool_mcp", "mcp") and args.get("arguments") is not None:
            text = json_text(expect(args["arguments"], dict, "an MCP call's arguments"))
        if text:
            puts.append(Put(key, text, TOOL_INPUT, None, lang))
        return puts
