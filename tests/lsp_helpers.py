"""Start `assistd lsp` as a subprocess and drive it with pytest-lsp's real LSP client."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import sys
from pathlib import Path

from lsprotocol import types
from pytest_lsp import ClientServerConfig, LanguageClient

LSP_ARGS: list[str] = []  # extra server flags (e.g. --log-file while debugging)


@contextlib.asynccontextmanager
async def lsp_session(db: Path, *, encodings=None, settings=None, root: Path | None = None,
                      env: dict | None = None):
    """A started and initialized server; yields ``(client, InitializeResult)``."""
    server_env = {**os.environ, "ASSISTD_DB": str(db), **(env or {})}
    config = ClientServerConfig(server_command=[sys.executable, "-m", "assistd", "lsp", *LSP_ARGS],
                                server_env=server_env)
    client: LanguageClient = await config.start()
    client.statuses = []  # the server's assistd/status notifications, in order

    @client.feature("assistd/status")
    def _status(ls, params):
        ls.statuses.append((params.state, params.message))

    general = types.GeneralClientCapabilities(position_encodings=encodings) if encodings else None
    caps = types.ClientCapabilities(
        general=general,
        text_document=types.TextDocumentClientCapabilities(
            inline_completion=types.InlineCompletionClientCapabilities(),
            synchronization=types.TextDocumentSyncClientCapabilities(did_save=True)),
        workspace=types.WorkspaceClientCapabilities(configuration=True))
    # No time budget unless a test sets one: exact expected suggestions must not depend
    # on how busy the machine is.
    opts = {"assistd": {"db": str(db), "maxLatencyMs": 0, **(settings or {})}}
    try:
        result = await client.initialize_session(types.InitializeParams(
            capabilities=caps, initialization_options=opts,
            root_uri=root.as_uri() if root else None))
        yield client, result
        await asyncio.wait_for(client.shutdown_session(), 60)
    finally:
        server = client._server  # a failed test must not leave the server (and pytest) hanging
        if server is not None and server.returncode is None:
            server.kill()
        await client.stop()


def open_doc(client: LanguageClient, path: Path, text: str, language: str = "python",
             version: int = 1) -> str:
    uri = path.as_uri()
    client.text_document_did_open(types.DidOpenTextDocumentParams(
        types.TextDocumentItem(uri=uri, language_id=language, version=version, text=text)))
    return uri


def insert(client: LanguageClient, uri: str, version: int, line: int, char: int, text: str):
    """An incremental didChange inserting ``text`` at (line, char)."""
    pos = types.Position(line, char)
    client.text_document_did_change(types.DidChangeTextDocumentParams(
        text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=version),
        content_changes=[types.TextDocumentContentChangePartial(range=types.Range(pos, pos),
                                                                text=text)]))


def inline_params(uri: str, line: int, char: int) -> types.InlineCompletionParams:
    return types.InlineCompletionParams(
        text_document=types.TextDocumentIdentifier(uri=uri), position=types.Position(line, char),
        context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Automatic))


async def inline(client: LanguageClient, uri: str, line: int, char: int) -> str | None:
    """The suggestion's text, or None for an empty list."""
    res = await client.text_document_inline_completion_async(inline_params(uri, line, char))
    items = res.items if isinstance(res, types.InlineCompletionList) else (res or [])
    return items[0].insert_text if items else None


async def inline_item(client: LanguageClient, uri: str, line: int, char: int):
    res = await client.text_document_inline_completion_async(inline_params(uri, line, char))
    items = res.items if isinstance(res, types.InlineCompletionList) else (res or [])
    return items[0] if items else None


async def stats(client: LanguageClient) -> dict:
    return await client.workspace_execute_command_async(
        types.ExecuteCommandParams(command="assistd.stats"))


# -- raw JSON-RPC over a socket (where a test needs the bytes, not a client) ----------

def frame(payload: dict) -> bytes:
    """``payload`` as one LSP message: Content-Length header, JSON body."""
    body = json.dumps(payload).encode()
    return b"Content-Length: %d\r\n\r\n" % len(body) + body


def answers(out: bytes) -> list[dict]:
    """Every framed message in a server's whole stdout, in order."""
    found = []
    while out:
        head, _, rest = out.partition(b"\r\n\r\n")
        size = int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0])
        found.append(json.loads(rest[:size]))
        out = rest[size:]
    return found


def read_message(sock: socket.socket) -> dict | None:
    """One framed message, or None when the peer closed the connection."""
    head = b""
    while not head.endswith(b"\r\n\r\n"):
        ch = sock.recv(1)
        if not ch:
            return None
        head += ch
    n = int(head.split(b"Content-Length:")[1].split(b"\r\n")[0])
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            return None
        data += chunk
    return json.loads(data)


def rpc(sock: socket.socket, msg_id, method: str, params=None) -> dict:
    """Send a request and return its response, skipping the server's notifications."""
    sock.sendall(frame({"jsonrpc": "2.0", "id": msg_id, "method": method, "params": params}))
    while True:
        out = read_message(sock)
        assert out is not None, f"connection closed waiting for {method}"
        if out.get("id") == msg_id and "method" not in out:
            return out


async def until(pred, timeout=120.0):
    """Wait for ``pred()`` (a generous bound against hangs, not a timing assert)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not pred():
        assert loop.time() < end, "timed out"
        await asyncio.sleep(0.05)
