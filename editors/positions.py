"""LSP positions -> offsets into a document, with range checks.

The code-unit arithmetic (UTF-8 / UTF-16 / UTF-32 columns) is pygls's
:class:`~pygls.workspace.PositionCodec`. Two things are ours: lines split the way LSP
defines them (only ``\\n``, ``\\r\\n`` and ``\\r``; ``str.splitlines`` also splits at
form feed and U+2028, which would shift every later line), and a position past the
end of its line or of the document is an error (pygls clamps it silently, which
would complete at a place the user did not ask for).
"""

from __future__ import annotations

import re

from lsprotocol import types
from pygls.workspace import PositionCodec

_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+$")


class PositionError(ValueError):
    """A position outside the document (the server answers InvalidParams)."""


def split_lines(text: str) -> list[str]:
    """Lines with their endings, as LSP counts them; a final line break opens an empty line.

    >>> split_lines("a\\r\\nb\\x0cc\\rd\\n")
    ['a\\r\\n', 'b\\x0cc\\r', 'd\\n', '']
    """
    lines = _LINE.findall(text)
    if text == "" or text.endswith(("\n", "\r")):
        lines.append("")
    return lines


def offset_at(text: str, position: types.Position, encoding: str = "utf-16") -> int:
    """Code-point offset into ``text`` of an LSP ``position`` in ``encoding`` units.

    Raises :class:`PositionError` when the line is past the last line or the character
    is past the end of that line (its line ending excluded).

    >>> offset_at("x = '😋'\\ny", types.Position(0, 7)), offset_at("x = '😋'\\ny", types.Position(1, 0))
    (6, 8)
    """
    encoding = getattr(encoding, "value", encoding)  # PositionEncodingKind or its string
    lines = split_lines(text)
    if position.line < 0 or position.line >= len(lines):
        raise PositionError(
            f"line {position.line} is past the end of the document ({len(lines)} lines, 0-based)"
        )
    codec = PositionCodec(types.PositionEncodingKind(encoding))
    line = lines[position.line]
    content = line.rstrip("\r\n")
    units = codec.client_num_units(content)
    if position.character < 0 or position.character > units:
        raise PositionError(
            f"character {position.character} is past the end of line {position.line}"
            f" ({units} {encoding} code units)"
        )
    col = codec.position_from_client_units([content], types.Position(0, position.character)).character
    return sum(len(x) for x in lines[: position.line]) + col


def position_at(text: str, offset: int, encoding: str = "utf-16") -> types.Position:
    """The LSP position of code-point ``offset`` (0..len(text)) in ``encoding`` units."""
    if not 0 <= offset <= len(text):
        raise PositionError(f"offset {offset} outside the document (0..{len(text)})")
    codec = PositionCodec(types.PositionEncodingKind(encoding))
    start = 0
    for i, line in enumerate(split_lines(text)):
        content = line.rstrip("\r\n")
        if offset <= start + len(content) or offset < start + len(line):
            return types.Position(i, codec.client_num_units(content[: offset - start]))
        start += len(line)
    raise AssertionError("unreachable: the last line ends at len(text)")
