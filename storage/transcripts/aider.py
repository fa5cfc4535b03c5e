"""aider's chat log ``.aider.chat.history.md`` (append-only markdown).

Written by Aider-AI/aider ``aider/io.py`` ``InputOutput.append_chat_history`` and its callers:

- a run starts with ``\\n# aider chat started at <time>\\n\\n``;
- ``user_input``: each user line as ``#### <line>``, every line ending in two spaces;
- tool output (``tool_output``/``tool_error``/``confirm_ask``): ``> <text>`` ending in two
  spaces (a markdown hard break). aider up to ~0.48 wrote a multi-line message as ONE
  ``> `` line followed by its unmarked continuation lines, the two spaces only after the
  last one; since then every line is prefixed (``_tool_message``);
- ``ai_output``: ``\\n<reply stripped>\\n\\n`` with no marker at all.

So a line is a user line if it starts with ``#### `` AND ends with two spaces, a tool line
if it starts with ``> `` (a ``> `` line without the two trailing spaces opens an old-style
multi-line message that runs to the first line ending in ``<non-space>  ``). Everything
else is assistant text; the trailing-spaces test keeps the model's own markdown
(``#### Heading``, ``>>>>>>> REPLACE``) in its reply. Heuristic limit: a reply line that
starts with ``> `` and lacks the two spaces is taken for an old-style tool message.

Each maximal block of assistant lines is one record keyed ``run<N>/reply<M>`` (run 0 is
text before the first header), emitted line by line: a Put for its first line and
Appends after it, so a reply still being written continues correctly in a later chunk.
Blank lines are held back until more text follows (trailing blank lines are stripped).
With ``context_turns`` on (offline replay), user and tool lines are emitted too (``_shown``).
"""

from __future__ import annotations

import re

from storage.transcripts.base import (
    ASSISTANT, TOOL_RESULT, USER, Append, Head, LineParser, Op, Put, register,
)

RUN_HEADER = "# aider chat started at "
_TOOL_END = re.compile(r"\S  $")  # last line of a message written with linebreak=True


@register
class AiderParser(LineParser):
    """aider chat history markdown (see module docstring)."""
    format = "aider"
    name_patterns = (".aider.chat.history.md", "*.chat.history.md")
    state_fields = ("run", "reply", "in_reply", "in_tool", "blank_lines")
    json_lines = False  # markdown: a line is complete only at its newline

    def __init__(self, cwd: str | None = None) -> None:
        """``cwd``: the project directory, if the caller knows it (aider writes the
        history file in the repository root by default); the file itself does not say."""
        super().__init__()
        self.cwd = cwd
        self.run = 0
        self.reply = 0          # replies started in this run
        self.in_reply = False   # inside an assistant block
        self.in_tool = False    # inside an old-style multi-line tool message
        self.blank_lines = 0    # blank lines held back inside the current reply
        self.shown_key: str | None = None  # context_turns: the user/tool record being extended
        self.shown_count = 0

    @classmethod
    def sniff(cls, head: Head) -> int:
        if re.search(r"^# aider chat started at ", head.text, re.M):
            return 3
        marked = re.findall(r"^(?:#### |> ).*\S  $", head.text, re.M)
        return 1 if len(marked) >= 3 else 0

    def _key(self) -> str:
        return f"run{self.run}/reply{self.reply}"

    def _close(self) -> None:
        self.in_reply = False
        self.blank_lines = 0

    def _shown(self, kind: str, text: str) -> list[Op]:
        """Context turns (``context_turns`` only): consecutive user lines form one record
        (kind user), consecutive tool lines another (kind tool_result)."""
        if not self.context_turns:
            return []
        text = text[:-2] if text.endswith("  ") else text
        if self.shown_key is not None and self.shown_key.split("/")[-1].startswith(kind):
            return [Append(self.shown_key, text, kind, self.cwd)]
        self.shown_count += 1
        self.shown_key = f"ctx:run{self.run}/{kind}{self.shown_count}"
        return [Put(self.shown_key, text, kind, self.cwd)]

    def _feed(self, line: str) -> list[Op]:
        if self.in_tool:
            if _TOOL_END.search(line) or line.startswith(RUN_HEADER):
                self.in_tool = False
            if not line.startswith(RUN_HEADER):
                return self._shown(TOOL_RESULT, line)
        if line.startswith(RUN_HEADER):
            self._close()
            self.run += 1
            self.reply = 0
            self.shown_key = None
            return []
        if line.startswith("#### ") and line.endswith("  "):
            self._close()
            return self._shown(USER, line[5:])
        if line.startswith("> "):
            self._close()
            self.in_tool = not line.endswith("  ")
            return self._shown(TOOL_RESULT, line[2:])
        if not line.strip():
            if self.in_reply:
                self.blank_lines += 1
            return []
        self.shown_key = None
        if self.in_reply:
            text = "\n" * self.blank_lines + line  # Append itself starts a new line
            self.blank_lines = 0
            return [Append(self._key(), text, ASSISTANT, self.cwd)]
        self.reply += 1
        self.in_reply = True
        return [Put(self._key(), line, ASSISTANT, self.cwd)]
