"""``assistd lsp``: the language server (pygls 2) for VS Code, Neovim and any LSP client.

The LSP method handlers: each parses its params, calls the session
(:class:`editors.session.AssistdServer`, over :class:`editors.completer.Completer`) and
formats the answer. The transport's bounds live in :mod:`editors.transport`.

Cancellation and supersession (docs/design.md, "Editors"): ``$/cancelRequest`` cancels the handler's
task, which sets the job's cancel flag; the engine checks it before every round.
A newer completion request for the same document sets the older one's flag: the
older gets an empty answer, so every request id gets exactly one response.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any
from urllib.parse import unquote

from lsprotocol import types

from assistd.ground.errors import AssistdError
from editors.completer import Completer, Suggestion
from editors.session import AssistdServer
from editors.settings import Settings

log = logging.getLogger("assistd.lsp")

ACCEPTED = "assistd.accepted"
STATS = "assistd.stats"
SHOWN = "assistd/didShowCompletion"
PARTIAL = "assistd/didPartiallyAcceptCompletion"
DISMISSED = "assistd/didDismissCompletion"


def _snippets(caps: types.ClientCapabilities | None) -> bool:
    item = getattr(getattr(getattr(caps, "text_document", None), "completion", None),
                   "completion_item", None)
    return bool(getattr(item, "snippet_support", False))


def _item_command(s: Suggestion) -> types.Command:
    # length: the characters this answer inserts, counted from the suggestion's start
    # (the suggestion may grow after it is answered: an accept counts what went in).
    return types.Command(title="assistd: suggestion accepted", command=ACCEPTED,
                         arguments=[{"id": s.id, "length": s.covers}])


def _param(params: Any, name: str, default=None):
    """A field of a custom notification's params (pygls gives an object, tests a dict)."""
    if isinstance(params, dict):
        return params.get(name, default)
    return getattr(params, name, default)


def build_server(settings: Settings | None = None, completer=None,
                 worker=None) -> AssistdServer:
    """A configured server; start it with ``start_io()`` or ``start_tcp(host, port)``.
    ``completer``: the engine side (default: a :class:`Completer` that opens its own
    runtime); ``worker``: the executor its calls run on (default: one thread)."""
    server = AssistdServer(settings, completer, worker)

    @server.feature(types.INITIALIZE)
    def initialize(ls: AssistdServer, params: types.InitializeParams):
        ls._main = asyncio.current_task()  # handlers run inline in pygls's read loop
        ls.apply_settings(params.initialization_options)
        # Load the model now, in the background, not on the first keystroke.
        ls.start_loading()
        if ls.watch_client and isinstance(params.process_id, int) and params.process_id > 0:
            ls.watch_client_process(params.process_id)

    @server.feature(types.INITIALIZED)
    async def initialized(ls: AssistdServer, params: types.InitializedParams):
        # Progress and notifications may only go out once initialize is answered.
        ls._initialized = True
        ls.set_status()
        await ls.show_loading()

    @server.feature(types.WORKSPACE_DID_CHANGE_CONFIGURATION)
    def did_change_configuration(ls: AssistdServer, params: types.DidChangeConfigurationParams):
        ls.apply_settings(params.settings)

    @server.feature(types.TEXT_DOCUMENT_DID_SAVE)
    def did_save(ls: AssistdServer, params: types.DidSaveTextDocumentParams):
        ls.submit(ls.completer.reindex, unquote(params.text_document.uri))

    @server.feature(types.TEXT_DOCUMENT_DID_CLOSE)
    def did_close(ls: AssistdServer, params: types.DidCloseTextDocumentParams):
        uri = unquote(params.text_document.uri)
        if (req := ls.latest.pop(uri, None)) is not None:
            req.cancel.set()
        ls.submit(ls.completer.drop_buffer, uri)

    @server.feature(types.TEXT_DOCUMENT_INLINE_COMPLETION, types.InlineCompletionOptions())
    async def inline_completion(ls: AssistdServer, params: types.InlineCompletionParams):
        explicit = params.context is not None and (
            params.context.trigger_kind == types.InlineCompletionTriggerKind.Invoked)
        s = await ls.suggest(params.text_document.uri, params.position, explicit=explicit)
        if s is None:
            return types.InlineCompletionList(items=[])
        pos = params.position
        # s.replace: whitespace before the cursor the text replaces (one code unit each in
        # every encoding); VS Code and Neovim 0.12 show only the text past the indentation.
        start = types.Position(pos.line, pos.character - s.replace)
        return types.InlineCompletionList(items=[types.InlineCompletionItem(
            insert_text=s.text, range=types.Range(start, pos), command=_item_command(s))])

    @server.feature(types.TEXT_DOCUMENT_COMPLETION,
                    types.CompletionOptions(trigger_characters=[".", "(", " "]))
    async def completion(ls: AssistdServer, params: types.CompletionParams):
        s = await ls.suggest(params.text_document.uri, params.position, "completion")
        if s is None or not s.item_text:
            return types.CompletionList(is_incomplete=True, items=[])
        first = s.text.lstrip("\r\n").splitlines()[0] if s.text.strip() else s.text
        pos = params.position
        # An older client filters items by the word before the cursor: the edit starts
        # at the cursor (or at the indentation it replaces: whitespace is no word to
        # filter by) and is always re-requested (isIncomplete) as the user types.
        # Its lines after the first are relative to the line's indentation (item_text):
        # VS Code (adjustIndentation) and vim.snippet.expand add it back.
        # A snippet (escaped) where the client takes snippets: Neovim 0.11 inserts a
        # plain-text item only up to its first whitespace (seen with its popup menu).
        text, fmt = s.item_text, types.InsertTextFormat.PlainText
        if _snippets(ls.client_capabilities):
            text = text.replace("\\", "\\\\").replace("$", "\\$").replace("}", "\\}")
            fmt = types.InsertTextFormat.Snippet
        return types.CompletionList(is_incomplete=True, items=[types.CompletionItem(
            label=first.strip()[:80] or s.text, kind=types.CompletionItemKind.Text,
            detail="assistd", insert_text_format=fmt,
            insert_text_mode=types.InsertTextMode.AdjustIndentation,
            text_edit=types.TextEdit(types.Range(types.Position(
                pos.line, pos.character - s.replace), pos), text), filter_text="",
            sort_text="0", command=_item_command(s))])

    @server.command(ACCEPTED)
    async def accepted(ls: AssistdServer, *args):
        sid = _param(args[0], "id") if args else None
        length = _param(args[0], "length", 0) if args else 0
        if sid:
            ls.submit(ls.completer.event, str(sid), "accepted",
                      length if isinstance(length, int) and length > 0 else 0)
        return None

    @server.command(STATS)
    async def stats(ls: AssistdServer, *args):
        try:
            return await ls.run(ls.completer.stats)
        except AssistdError as e:
            ls.report(e)
            return {"error": str(e)}

    @server.feature(SHOWN)
    def shown(ls: AssistdServer, params):
        if sid := _param(params, "id"):
            ls.submit(ls.completer.event, str(sid), "shown")

    @server.feature(PARTIAL)
    def partial(ls: AssistdServer, params):
        sid, n = _param(params, "id"), _param(params, "acceptedLength", 0)
        if sid and isinstance(n, int) and n > 0:
            ls.submit(ls.completer.event, str(sid), "partial", n)

    @server.feature(DISMISSED)
    def dismissed(ls: AssistdServer, params):
        if sid := _param(params, "id"):
            ls.submit(ls.completer.event, str(sid), "dismissed")

    @server.feature(types.EXIT)
    def exit_(ls: AssistdServer, params):
        ls._stopped = True  # pygls exits now; a client gone meanwhile must not exit twice
        ls.stop_growing()
        for req in ls.latest.values():
            req.cancel.set()

    @server.feature(types.SHUTDOWN)
    async def shutdown(ls: AssistdServer, params):
        ls.stop_growing()
        for req in ls.latest.values():
            req.cancel.set()
        # Cancel pending requests here, over a copy: pygls 2.1 cancels them while
        # iterating the dict their callbacks pop from ("dictionary changed size").
        # This handler's own task is in that dict too, under a key of pygls's.
        current, me = ls.protocol.msg_id, asyncio.current_task()
        for msg_id, fut in list(ls.protocol._request_futures.items()):
            if msg_id != current and fut is not me and not fut.done():
                fut.cancel()
        # Awaited, with no timeout: a shutdown right after start waits for the model
        # to finish loading, then answers null (it was a -32603 after 30 s on a busy
        # machine, with the event loop blocked meanwhile).
        try:
            await ls.run(ls.completer.close)
        except asyncio.CancelledError:
            # The client left without waiting for the answer (Neovim's :qa!) and pygls
            # cancelled this request: the close goes on on the engine thread, there is
            # no one to answer, and a CancelledError out of pygls's callback would be
            # logged by asyncio as an ERROR with a traceback.
            log.debug("the client left before the shutdown reply")

    return server


def serve_hosted(runtime, executor, reader, writer, *, label: str = "") -> None:
    """One editor connection hosted by the daemon (the factory ``assistd serve``
    registers): a language server over ``reader``/``writer`` (the connection's binary
    streams), its :class:`Completer` on the daemon's ``runtime``, every engine call on
    ``executor`` (the daemon's scheduler at editor priority). Returns when the client
    exits or disconnects; the session's buffers then leave the shared history index."""
    completer = Completer(shared=runtime)
    completer.owner, completer.host = f"lsp:{label.rpartition('#')[2]}", label
    server = build_server(completer=completer, worker=executor)
    server.watch_client = False  # `assistd lsp` (the pipe) watches the editor instead
    try:
        server.start_io(reader, writer)
    finally:
        executor.submit(completer.close).result(timeout=30)
