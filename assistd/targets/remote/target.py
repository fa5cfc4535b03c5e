"""The remote Target: a model behind an OpenAI-compatible inference server (llama.cpp's
or llama-cpp-python's server, vLLM), assembled from its parts: the connection
(:mod:`~assistd.targets.remote.network`), the tokenizer
(:mod:`~assistd.targets.remote.tokenizer`), the prompt as sent
(:mod:`~assistd.targets.remote.prompts`), FIM (:mod:`~assistd.targets.remote.fim`) and
the streamed generation (:mod:`~assistd.targets.remote.generation`). This module keeps
its settings and its health: what ``assistd status`` shows of the server."""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path

import httpx

from assistd.ground.errors import InputError, ModelError
from assistd.ground.options import DEFAULT_N_CTX
from assistd.targets.base import tokenizer_fingerprint
from assistd.targets.llama import GGUF_MAGIC
from assistd.targets.remote.errors import RemoteTargetError, printable
from assistd.targets.remote.fim import FIM_SETTINGS, Fim
from assistd.targets.remote.generation import Generating
from assistd.targets.remote.gguf_vocab import LlamaVocab
from assistd.targets.remote.hf_vocab import HFVocab
from assistd.targets.remote.network import Server, base_url, ssl_context
from assistd.targets.remote.prompts import Prompting

log = logging.getLogger("assistd.targets.remote")  # one logger for the whole remote Target

PROBE_EVERY_S = 3.0  # status probes /v1/models at most this often
MODEL_ID_CHARS = 1024  # a longer "id" in /v1/models is no model id
CONTEXT_SETTINGS = ("all", "file")  # what a prompt may carry to the server, see RemoteTarget


def local_vocab(path: Path) -> LlamaVocab | HFVocab:
    """The server model's tokenizer at ``path``: a GGUF file (by its first bytes) ->
    :class:`LlamaVocab`; a Hugging Face folder, or a JSON file (its tokenizer.json) ->
    :class:`HFVocab`. Raises :class:`ModelError` for a path that is missing, unreadable
    or neither."""
    if not path.exists():
        raise ModelError(f"model file not found: {path}; pass --model the served model's"
                         " GGUF, its Hugging Face folder or its tokenizer.json")
    if not path.is_file():
        return HFVocab(path)  # a folder
    try:
        with path.open("rb") as f:
            head = f.read(64)
    except OSError as e:
        raise ModelError(f"cannot read the tokenizer {path} ({e.strerror})") from None
    if head[:4] == GGUF_MAGIC:
        return LlamaVocab(path)
    if head.lstrip()[:1] == b"{":
        return HFVocab(path)
    raise ModelError(f"not a GGUF model file nor a Hugging Face tokenizer.json: {path}; pass"
                     " --model the served model's GGUF, its Hugging Face folder or its"
                     " tokenizer.json")


class RemoteTarget(Generating, Prompting, Fim):
    """A model behind an OpenAI-compatible server at ``url``.

    ``key``: the bearer key (see :func:`~assistd.targets.remote.auth.read_key`), or
    None; ``key_file``: the file it came from, read again when it changes (a key rotated
    in place). ``model_name``: the ``model`` field sent (None: the server's first in
    ``/v1/models``, or none). ``tokenizer``: the server model's tokenizer, its GGUF or
    its Hugging Face folder or tokenizer.json (:func:`local_vocab`; see
    :mod:`~assistd.targets.remote.tokenizer`), or None. ``n_ctx``: the
    server's context window, in its tokens (assistd cannot always ask). ``timeout_s``:
    the longest wait for the next streamed chunk (seconds).
    ``deadline_s``: the longest one generation may take, seconds (None: derived from
    its ``max_tokens``, :meth:`deadline_for`).
    ``ca_bundle``: a PEM file of CA certificates. ``context``: what a prompt may
    carry besides the document being completed: "all" (cross-file snippets of the
    scope's other open buffers, after the secret filter) or "file" (the document's own
    text only; :attr:`context` is read by the editor completer). ``fim``: the FIM
    layout: "auto" (see :meth:`fim_tokens`), "none", or a family of
    :data:`~assistd.targets.remote.fim.FIM_FAMILIES`. Raises :class:`InputError` for a
    bad URL, CA bundle, ``context`` or ``fim``, :class:`ModelError` for a ``tokenizer``
    that holds none; a server that is down is not an error here (status says so, and
    each generation tries again).
    """

    backend = "openai"
    remote = True
    numerics = "remote"
    promise = None  # nothing is verified here
    device = "remote"
    speculation_off = ("remote Target: the server decodes (its own speculation, or none);"
                       " assistd does not verify drafts against it")

    def __init__(self, url: str, *, key: str | None = None, key_file: Path | str | None = None,
                 model_name: str | None = None,
                 tokenizer: Path | str | None = None, n_ctx: int = DEFAULT_N_CTX,
                 timeout_s: float = 30.0, deadline_s: float | None = None,
                 ca_bundle: Path | str | None = None,
                 context: str = "all", fim: str = "auto", environ=None):
        super().__init__()
        environ = os.environ if environ is None else environ
        self.url = base_url(url)
        if context not in CONTEXT_SETTINGS:
            raise InputError(f"target_context must be all or file, not {context!r}")
        if fim not in FIM_SETTINGS:
            raise InputError(f"target_fim must be one of {', '.join(FIM_SETTINGS)}, not {fim!r}")
        self.context, self.fim = context, fim
        verify = ssl_context(ca_bundle, environ)  # bad input fails before anything opens
        self.model_path = self.url
        self.model_name = model_name
        self.n_ctx = int(n_ctx)
        self.timeout_s = float(timeout_s)
        self.deadline_s = None if deadline_s is None else float(deadline_s)
        if self.deadline_s is not None and not self.deadline_s > 0:
            raise InputError(f"target_deadline_ms must be positive, not {deadline_s!r}")
        self._tokenizer_path = Path(tokenizer).expanduser() if tokenizer else None
        self._vocab = local_vocab(self._tokenizer_path) if tokenizer else None
        self.server = Server(self.url, key=key, key_file=key_file, timeout_s=self.timeout_s,
                             verify=verify)
        self._init_tokenizer()
        self._init_prompting()
        self._init_fim()
        v = self._vocab
        self.n_vocab = v.n_vocab if v else 0x110000  # else ids are (at most) code points
        self.bos_token_id = v.bos_token_id if v else None
        self.add_bos = v.add_bos if v else False
        self.eos_token_ids = v.eos_token_ids if v else frozenset()
        self.fingerprint = v.fingerprint if v else tokenizer_fingerprint(
            [b"assistd remote tokenizer", self.url.encode(), (model_name or "").encode()])
        self.state = {"reachable": None, "model": self.server.shown(model_name),
                      "latency_ms": None, "last_error": None, "checked_at": None,
                      "model_listed": None}  # --target-model among the server's models
        self._prober: threading.Thread | None = None
        if self.probe()["last_error"]:  # said at start: a daemon would otherwise start silently
            log.warning("warning: %s (at start: requests fail until it serves)",
                        self.state["last_error"])

    def __repr__(self) -> str:
        return f"RemoteTarget({self.url!r}, model={self.display_model!r}, tokenizer={self._mode!r})"

    @property
    def display_model(self) -> str | None:
        """The model's name as shown (status, the daemon's ``/v1/models``, the log): the
        server's id with the key replaced and control characters escaped, at most
        ``ERROR_CHARS`` characters. Requests send :attr:`model_name` as it came."""
        return self.server.shown(self.model_name)

    def chat_template(self) -> str | None:
        """The local tokenizer's template: the folder's (``chat_template.jinja``, else
        tokenizer_config.json's), or the GGUF's; None without one (the base class would
        read ``model_path``: the URL)."""
        if self._tokenizer_path is None:
            return None
        if isinstance(self._vocab, HFVocab):
            return self._vocab.chat_template()
        from assistd.targets.gguf_header import gguf_metadata

        try:
            return gguf_metadata(self._tokenizer_path, {"tokenizer.chat_template"}).get(
                "tokenizer.chat_template")
        except Exception:  # noqa: BLE001 - unreadable: no template, as the base class
            return None

    # -- health ----------------------------------------------------------------

    def probe(self) -> dict:
        """``GET /v1/models`` now: updates and returns :meth:`status`' state (reachable,
        the model id, the latency in ms, the last error). Never raises."""
        t0 = time.perf_counter()
        try:
            r = self.server.fetch("GET", "/v1/models", timeout=self.server.connect_timeout_s)
            ms = (time.perf_counter() - t0) * 1000
            if r.status_code != 200:
                raise RemoteTargetError(self.server.http_message(r.status_code, r.text, r.headers),
                                        "http")
            try:
                data = r.json().get("data", [])
            except (ValueError, AttributeError):
                data = None
            if not isinstance(data, list):
                raise RemoteTargetError(f"the remote Target {self.url} answered /v1/models"
                                        " with no list of models", "malformed")
            data = [m for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)
                    and 0 < len(m["id"]) <= MODEL_ID_CHARS]
            ids = [m["id"] for m in data]
            if self.model_name is None and ids:
                self.model_name = ids[0]
            elif ids and self.state.get("model_listed") is None:
                self.state["model_listed"] = self.model_name in ids
                if self.model_name not in ids:  # said once: some servers ignore the name
                    log.warning("warning: the remote Target %s lists %s, not --target-model"
                                " %r: a server that checks the name will refuse requests",
                                self.url, ", ".join(map(self.server.shown, ids[:5])),
                                self.display_model)
            self._fit_context(next((m for m in data if m.get("id") == self.model_name),
                                   data[0] if data else {}))
            self._seen(ms, model=self.display_model or (self.server.shown(ids[0]) if ids else None))
        except httpx.HTTPError as e:
            self._failed(self.server.transport_message(e))
        except RemoteTargetError as e:
            self._failed(str(e), answered=True)
        except Exception as e:  # noqa: BLE001 - a probe never raises: status shows it
            self._failed(printable(self.server.redact(
                f"the remote Target {self.url}: /v1/models: {type(e).__name__}: {e}")),
                answered=True)
        return dict(self.state)

    def _fit_context(self, listed: dict) -> None:
        """The server's context window, where its ``/v1/models`` says it (llama.cpp's
        ``meta.n_ctx``, vLLM's ``max_model_len``): a smaller one than ``n_ctx`` is taken,
        said once, so that prompts are budgeted to what the server holds (each request
        failed with its 400 before)."""
        meta = listed.get("meta") if isinstance(listed.get("meta"), dict) else {}
        ctx = meta.get("n_ctx", listed.get("max_model_len"))
        if isinstance(ctx, int) and not isinstance(ctx, bool) and 64 <= ctx < self.n_ctx:
            log.warning("warning: the remote Target %s holds %d tokens of context, not"
                        " n_ctx %d: prompts are budgeted to %d", self.url, ctx, self.n_ctx, ctx)
            self.n_ctx = ctx

    def status(self) -> dict:
        """The remote Target's state for ``assistd status``: ``url``, ``reachable``
        (bool, or None before any contact), ``model``, ``latency_ms`` (the last
        request's time to its answer's headers), ``last_error``, ``tokenizer``,
        ``checked_ago_s`` (how old that state is, seconds; None before any contact). Never
        blocks (the daemon answers status on its event loop): when the state is older
        than :data:`PROBE_EVERY_S` a probe starts on a thread of its own and the next call
        shows its result; a failed request shows at once (:meth:`_failed`)."""
        checked = self.state["checked_at"]
        stale = checked is None or time.time() - checked > PROBE_EVERY_S
        if stale and (self._prober is None or not self._prober.is_alive()):
            self._prober = threading.Thread(target=self.probe, name="assistd-remote-probe",
                                            daemon=True)
            self._prober.start()
        ago = None if checked is None else round(max(0.0, time.time() - checked), 1)
        return {"url": self.url, **self.state, "tokenizer": self._mode or "unknown yet",
                "checked_ago_s": ago}

    def _seen(self, ms: float, model: str | None = None) -> None:
        self.state.update(reachable=True, latency_ms=round(ms, 2), last_error=None,
                          checked_at=time.time())
        if model:
            self.state["model"] = model

    def _failed(self, message: str, answered: bool = False) -> None:
        """A request failed: ``answered`` when the server sent an HTTP error (it is
        reachable, and failing), else it did not answer (no latency to show)."""
        self.state.update(reachable=answered, last_error=message, checked_at=time.time(),
                          **({} if answered else {"latency_ms": None}))
    # -- no local evaluation ---------------------------------------------------------

    def _evaluate(self, tokens, rows, n_past):
        raise RuntimeError("a remote Target has no local KV cache to evaluate on")

    def _truncate(self, n: int) -> None:
        pass

    def close(self) -> None:
        self.server.close()
        if self._vocab is not None:
            self._vocab.close()
            self._vocab = None
