"""``assistd lsp`` as a subprocess, driven by pytest-lsp's real LSP client: a session
started and initialized, documents opened and edited, inline completions asked for.
The editor tests and the typing benchmarks use it."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from pathlib import Path

from lsprotocol import types
from pytest_lsp import ClientServerConfig, LanguageClient

LSP_ARGS: list[str] = []  # extra server flags (e.g. --log-file), set in place: LSP_ARGS[:] = [...]


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
    """A didOpen of ``path`` holding ``text``; returns its URI."""
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
    """An automatically triggered inline completion request at (line, char)."""
    return types.InlineCompletionParams(
        text_document=types.TextDocumentIdentifier(uri=uri), position=types.Position(line, char),
        context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Automatic))


async def inline(client: LanguageClient, uri: str, line: int, char: int) -> str | None:
    """The suggestion's text, or None for an empty list."""
    res = await client.text_document_inline_completion_async(inline_params(uri, line, char))
    items = res.items if isinstance(res, types.InlineCompletionList) else (res or [])
    return items[0].insert_text if items else None


async def inline_item(client: LanguageClient, uri: str, line: int, char: int):
    """The first suggestion (an ``InlineCompletionItem``), or None for an empty list."""
    res = await client.text_document_inline_completion_async(inline_params(uri, line, char))
    items = res.items if isinstance(res, types.InlineCompletionList) else (res or [])
    return items[0] if items else None


async def stats(client: LanguageClient) -> dict:
    """The server's ``assistd.stats`` command: its counters (editors.completer.Counters)."""
    return await client.workspace_execute_command_async(
        types.ExecuteCommandParams(command="assistd.stats"))
