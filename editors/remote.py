"""The LSP server as a client of the daemon: :class:`RemoteCompleter` has the
:class:`editors.completer.Completer` methods the server calls, and runs each on the
daemon (``POST /v1/assistd/lsp``), where a per-session Completer shares the daemon's
Target, history and tuner, at the editor priority (it runs between the rounds of an
agent's generation rather than after it).

Calls block (the server runs them on its worker thread). A request's cancel flag
(a newer keystroke, ``$/cancelRequest``) is forwarded while the daemon works on it,
so the generation there stops within one round.
"""

from __future__ import annotations

import logging
import threading
import uuid
from dataclasses import asdict

from assistd.serving.client import DaemonClient
from assistd.ground.ledger import Ledger
from editors.completer import Counters, Request, Suggestion
from editors.settings import Settings

log = logging.getLogger("assistd.lsp")


class RemoteCompleter:
    def __init__(self, client: DaemonClient, settings: Settings | None = None):
        self.client = client
        self.settings = settings or Settings()
        self.session = uuid.uuid4().hex
        self.counters = Counters()  # what this process saw; the daemon keeps the rest

    def _call(self, op: str, args: dict | None = None):
        return self.client.post("/v1/assistd/lsp", {"session": self.session, "op": op,
                                                    "args": args or {}})["result"]

    def configure(self, settings: Settings) -> None:
        if settings.engine_key() != Settings().engine_key():
            log.warning("the daemon's Target and history serve this editor: the model,"
                        " backend, n_ctx and db settings are the daemon's (assistd serve)")
        self.settings = settings
        self._call("configure", {"settings": asdict(settings)})

    def open(self) -> None:
        self._call("configure", {"settings": asdict(self.settings)})

    def close(self) -> None:
        try:
            self._call("close")
        except Exception as e:  # noqa: BLE001 - the daemon may be gone already
            log.warning("closing the daemon session failed: %s", e)
        self.client.close()

    def complete(self, req: Request) -> Suggestion:
        self.counters.requests += 1
        if req.cancel.is_set():
            self.counters.cancelled_before_start += 1
            return Suggestion(id="", text="", source="cancelled")
        rid = uuid.uuid4().hex
        done = threading.Event()

        def forward_cancel():
            while not done.is_set():
                if req.cancel.wait(0.05):
                    if not done.is_set():
                        try:
                            self._call("cancel", {"request_id": rid})
                        except Exception:  # noqa: BLE001 - the answer comes anyway
                            pass
                    return

        watcher = threading.Thread(target=forward_cancel, daemon=True)
        watcher.start()
        try:
            out = self._call("complete", {"request_id": rid, "uri": req.uri, "text": req.text,
                                          "offset": req.offset, "language": req.language,
                                          "buffers": req.buffers})
        finally:
            done.set()
        fields = Ledger.__dataclass_fields__
        ledger = (Ledger(**{k: v for k, v in out["ledger"].items() if k in fields})
                  if out.get("ledger") else None)
        return Suggestion(id=out["id"], text=out["text"], source=out["source"],
                          stop_reason=out.get("stop_reason"), ledger=ledger,
                          ms=out.get("ms", 0.0))

    def reindex(self, uri: str) -> None:
        self._call("reindex", {"uri": uri})

    def drop_buffer(self, uri: str) -> None:
        self._call("drop_buffer", {"uri": uri})

    def event(self, sid: str, event: str, accepted_chars: int = 0) -> bool:
        return bool(self._call("event", {"id": sid, "event": event,
                                         "accepted_chars": accepted_chars}))

    def stats(self) -> dict:
        out = self._call("stats")
        out["daemon"] = str(self.client.path)
        return out

