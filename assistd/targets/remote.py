"""A remote Target: an OpenAI-compatible inference server (llama.cpp's or
llama-cpp-python's server, vLLM) that assistd sends its prompts to.

The server decodes; assistd does not verify drafts against it (docs/design.md,
"Remote Target"), so :attr:`RemoteTarget.speculation_off` is set and the runtime sends
each generation to ``POST /v1/completions`` with ``stream: true`` (server-sent events,
one ``data:`` line per chunk, ``data: [DONE]`` at the end) instead of running the
speculative loop. History, scopes, prompts and the front ends stay local.

Tokenization, for prompt budgets and the history's token space, in this order:

1. ``model`` given (a GGUF file): its own vocabulary, loaded by llama.cpp without the
   weights (``vocab_only``); the fingerprint is the local Target's, so both share a
   history.
2. the server's tokenize endpoint: llama-cpp-python's ``/extras/tokenize`` or the
   ``/tokenize`` of llama.cpp's server and vLLM.
3. else a character budget: one id per character, 4 characters per token, said once
   in the log.

The prompt goes as token ids where the server takes them (asked once:
:meth:`RemoteTarget.takes_token_ids`; llama.cpp's ``llama-server`` and vLLM do), else
as text with control-token spellings defused (:meth:`RemoteTarget.prompt_text`).

Network rules: the key (a 0600 file, or ``$ASSISTD_TARGET_KEY``) goes only to the
configured URL (redirects are never followed) and never into a log, message or repr;
``http://`` to a host other than this machine (loopback, or the unspecified 0.0.0.0)
warns once; the proxy and CA variables are honoured (httpx ``trust_env``;
``REQUESTS_CA_BUNDLE`` too), and a CA bundle may be given. What a prompt carries: the
document's text, and with ``context="all"`` cross-file snippets of the scope's other
open buffers, which have passed the history's secret filter (editors/crossfile.py);
nothing from the history itself (a remote Target does not draft, so no scope is read).

Retry policy: a connection refused or timed out while connecting (not a failed TLS
handshake: it would fail again), and HTTP 429 or 503,
are retried at most :data:`RETRIES` times, and only before any text arrived (waiting
``Retry-After`` when the server gives one, up to :data:`RETRY_AFTER_MAX_S` and never past
the deadline); never once text has streamed, and never after a read timeout (the server
may still be working).

Limits, against a server that is slow, broken or hostile (docs/design.md, "Remote Target"):

- a deadline per generation (:meth:`RemoteTarget.deadline_for`): ``--target-deadline-ms``,
  else ``target_timeout + max_tokens / DEADLINE_TOKENS_PER_S`` seconds; and no text for
  twice ``target_timeout`` (keep-alive comments and empty chunks are no text; a silent
  socket fails sooner, at the read timeout) ends it too;
- reading stops at ``max_tokens`` worth of text: ``max_tokens`` non-empty chunks, and
  at most :data:`MAX_TOKEN_CHARS` characters per token;
- every read is capped in bytes: an event line :data:`MAX_LINE_BYTES`, a stream
  :data:`MAX_STREAM_BYTES`, an answer's body :data:`MAX_BODY_BYTES`, an error's body
  :data:`MAX_ERROR_BYTES` (the rest is not read); answers are asked for uncompressed;
- what the server says (error text, headers, model ids) has the key replaced, also a
  piece of it of :data:`KEY_PIECE` characters or more, before anything is cut, and its
  control characters escaped (:func:`printable`) before it reaches a message, the log,
  ``status`` or the API; a chunk of the wrong shape is one error of kind "malformed".
"""

from __future__ import annotations

import ctypes
import ipaddress
import logging
import math
import os
import queue
import re
import socket
import ssl
import stat
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from assistd.ground import jsonlimits
from assistd.ground.errors import InputError, ModelError
from assistd.ground.ledger import Ledger
from assistd.targets.base import Target, encodable, tokenizer_fingerprint

log = logging.getLogger("assistd.targets.remote")
# httpcore's debug traces print each answer's headers, where a hostile server may echo
# the key (a Retry-After, any header): they never reach assistd's log.
logging.getLogger("httpcore").setLevel(logging.INFO)

KEY_ENV = "ASSISTD_TARGET_KEY"
RETRIES = 2  # retries of a request that got no text yet (connect error, 429, 503)
RETRY_AFTER_MAX_S = 10.0  # a longer Retry-After fails at once, naming the wait
BACKOFF_S = (0.25, 1.0)  # waits between retries without a Retry-After
CONNECT_TIMEOUT_S = 5.0
CHARS_PER_TOKEN = 4  # the character budget when no tokenizer is known
POLL_S = 0.02  # how often a waiting generation checks cancelled()
PROBE_EVERY_S = 3.0  # status probes /v1/models at most this often
# The default deadline of one generation: the read timeout for the first chunk, then at
# least this many tokens a second. Lenient on purpose: the embedded model on a loaded
# 2-core machine streams 1-2 a second, and a stream that sends no text at all is ended
# sooner, by the read timeout (see RemoteTarget.complete).
DEADLINE_TOKENS_PER_S = 1.0
MAX_TOKEN_CHARS = 128  # a generous bound on one token's text (characters)
MAX_LINE_BYTES = 1 << 20  # one server-sent event line
MAX_STREAM_BYTES = 64 << 20  # one streamed answer, all lines
MAX_BODY_BYTES = 2 << 20  # one answer's JSON (/v1/models, tokenize: ~1 MB per 128k ids)
MAX_ERROR_BYTES = 64 << 10  # an error's body; the rest is not read
ERROR_CHARS = 200  # the server's own error text kept in a message
MODEL_ID_CHARS = 1024  # a longer "id" in /v1/models is no model id
MAX_URL_CHARS = 2048  # --target-url
KEY_PIECE = 8  # a piece of the key this long in a server's echo is replaced too
JSON_DEPTH = 64  # nesting of a server's JSON (an answer, a chunk) before it is refused
QUEUE_EVENTS = 256  # events read ahead of the caller (the reader then waits)


# FIM layouts by model family: the (prefix, suffix, middle) markers, sent in that
# order (prefix-suffix-middle), as the models' tokenizers spell them.
FIM_FAMILIES = {
    # StarCoder(2), SantaCoder, Granite code
    "starcoder": ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"),
    "qwen": ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),  # Qwen2.5-Coder, CodeGemma
    "deepseek": ("<\uff5cfim\u2581begin\uff5c>", "<\uff5cfim\u2581hole\uff5c>",
                 "<\uff5cfim\u2581end\uff5c>"),  # DeepSeek-Coder
}
FIM_SETTINGS = ("auto", "none", *FIM_FAMILIES)
CONTEXT_SETTINGS = ("all", "file")  # what a prompt may carry to the server, see RemoteTarget
_UNDECIDED = object()
# What a control token's spelling looks like in the vocabularies assistd knows
# (<|im_start|>, <start_of_turn>, </s>, <｜fim▁begin｜>, [INST]): the candidates a
# server without a local tokenizer is asked about (see RemoteTarget.control_spellings).
CONTROL_SHAPE = re.compile(r"<[^\s<>]{1,64}>|\[/?[A-Z][A-Z_]{1,30}\]")
SHAPES_KEPT = 4096  # classified spellings remembered (ordinary ones are forgotten first)
ZWSP = "\u200b"
_SENTINEL = "\ue000\ue0ff"  # private-use text standing in for a control token in one request


def defuse(text: str, spellings) -> str:
    """``text`` with every control spelling in ``spellings`` broken by a zero-width
    space after its first character, so that a server which parses control tokens in
    its prompt reads it as text.

    >>> defuse("a<|im_start|>b", ["<|im_start|>"]) == "a<" + ZWSP + "|im_start|>b"
    True
    """
    for m in spellings:
        if m in text:
            text = text.replace(m, m[0] + ZWSP + m[1:])
    return text


_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e"
                      "\u2066-\u2069\ud800-\udfff]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def printable(text: str) -> str:
    """``text`` with every control character escaped (C0, DEL, C1, the bidirectional
    overrides, lone surrogates): what a server wrote reaches a terminal as text.

    >>> printable("a\\x1b[2Jb\\n")
    'a\\\\x1b[2Jb\\\\n'
    """
    def esc(m):
        c = m.group()
        return _NAMED.get(c) or (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")

    return _CONTROL.sub(esc, text)


class RemoteTargetError(ModelError):
    """The remote Target could not answer: down, slow, refusing, failing. The message
    names the server's URL (never the key) and what to check, on one line (control
    characters escaped). ``kind``: "unreachable" (no answer: refused, timed out),
    "http" (an HTTP error status), "deadline" (past :meth:`RemoteTarget.deadline_for`),
    "too_large" (a line or body over its cap) or "malformed" (an answer of the wrong
    shape); :attr:`http_status` is the API's status for it (503, 502, 504)."""

    STATUS = {"unreachable": 503, "deadline": 504}

    def __init__(self, message: str, kind: str = "unreachable"):
        super().__init__(printable(str(message)))
        self.kind = kind

    @property
    def http_status(self) -> int:
        return self.STATUS.get(self.kind, 502)


def read_key(path: Path | str | None, environ=None) -> str | None:
    """The API key: the file at ``path`` (whitespace stripped), else ``$ASSISTD_TARGET_KEY``,
    else None. Raises :class:`InputError` for a file that is missing, unreadable, empty,
    or readable by its group or others (the fix: ``chmod 600``)."""
    environ = os.environ if environ is None else environ
    if path is None:
        return _checked_key(environ.get(KEY_ENV, ""), f"${KEY_ENV}") or None
    p = Path(path).expanduser()
    try:
        st = p.stat()
    except OSError as e:
        raise InputError(f"target key file {p}: {e.strerror}; pass a file holding the key") from None
    if not stat.S_ISREG(st.st_mode):
        raise InputError(f"target key file {p} is not a regular file")
    if st.st_mode & 0o077:
        raise InputError(f"target key file {p} is readable by others (mode"
                         f" {stat.S_IMODE(st.st_mode):04o}); run: chmod 600 {p}")
    try:
        key = p.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"cannot read target key file {p}: {e}") from None
    if not key:
        raise InputError(f"target key file {p} is empty")
    return _checked_key(key, f"target key file {p}")


def _checked_key(key: str, where: str) -> str:
    """``key`` without surrounding whitespace; InputError if it holds whitespace or a
    control character inside (it would not fit an HTTP header: httpx would refuse the
    request with a protocol error naming nothing)."""
    key = key.strip()
    if any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in key):
        raise InputError(f"{where} holds whitespace or a control character inside the key"
                         " (a key is one line of printable characters)")
    return key


class _KeyFile(httpx.Auth):
    """The bearer key of a key file, read again when the file changes (its mtime, size
    or mode), so that a key rotated in place is used from the next request on without a
    restart. A file that turns bad (mode, empty, gone) keeps the last good key and
    warns once per change."""

    def __init__(self, path: Path | str, key: str | None):
        self.path, self.key = Path(path).expanduser(), key
        self._seen = self._stamp()

    def _stamp(self):
        try:
            st = self.path.stat()
            return (st.st_mtime_ns, st.st_size, st.st_mode)
        except OSError:
            return None

    def auth_flow(self, request):
        stamp = self._stamp()
        if stamp != self._seen:
            self._seen = stamp
            try:
                self.key = read_key(self.path)
                log.info("target key file %s changed: the new key is used", self.path)
            except InputError as e:
                log.warning("warning: %s; the key read before is still used", e)
        if self.key:
            request.headers["Authorization"] = f"Bearer {self.key}"
        yield request


def is_this_machine(host: str) -> bool:
    """``localhost``, a loopback address (127.0.0.0/8, ::1), or the unspecified address
    (0.0.0.0, ::): a bind address, which a client connecting to it reaches on this
    machine (Linux and macOS connect it to loopback), so nothing crosses the network."""
    if host.lower() == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    return ip.is_loopback or ip.is_unspecified


def base_url(url: str) -> str:
    """``url`` checked and reduced to the server's base (a trailing ``/`` and ``/v1``
    dropped). Raises :class:`InputError` for anything but an
    ``http(s)://host[:port][/path]`` URL (credentials in it included) of at most
    :data:`MAX_URL_CHARS` characters."""
    if len(url) > MAX_URL_CHARS:
        raise InputError(f"--target-url is {len(url)} characters long; a server's base URL"
                         f" has at most {MAX_URL_CHARS} (e.g. http://127.0.0.1:8080)")
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError as e:
        raise InputError(f"--target-url {url[:100]!r} is not a URL: {e}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InputError(f"--target-url {url[:100]!r} must be http(s)://HOST[:PORT], e.g."
                         " http://127.0.0.1:8080")
    if parts.query or parts.fragment:
        raise InputError("--target-url takes no query or fragment")
    if parts.username or parts.password:  # it would be logged and shown in status
        raise InputError("--target-url must not hold credentials; put the key in"
                         f" --target-key-file or ${KEY_ENV}")
    host = parts.hostname if ":" not in parts.hostname else f"[{parts.hostname}]"
    path = parts.path.rstrip("/")
    if path.endswith("/v1"):
        path = path[:-3]
    out = f"{parts.scheme}://{host}{f':{port}' if port else ''}{path}"
    try:
        httpx.URL(out)  # what the client will refuse: e.g. a control character in the host
    except httpx.InvalidURL as e:
        raise InputError(f"--target-url {url[:100]!r} is not a URL: {e}") from None
    return out


_warned_plain: set[str] = set()


def _ssl_context(ca_bundle: Path | str | None, environ) -> ssl.SSLContext | bool:
    """What httpx verifies TLS with: ``ca_bundle``, else ``$REQUESTS_CA_BUNDLE`` (httpx
    itself reads ``$SSL_CERT_FILE``/``$SSL_CERT_DIR``), else httpx's default."""
    path = ca_bundle or (None if environ.get("SSL_CERT_FILE") else environ.get("REQUESTS_CA_BUNDLE"))
    if not path:
        return True
    try:
        return ssl.create_default_context(cafile=str(Path(path).expanduser()))
    except (OSError, ssl.SSLError) as e:
        raise InputError(f"CA bundle {path}: {e}") from None


@dataclass
class _Answer:
    """A non-streamed answer, read to its cap (:meth:`RemoteTarget._fetch`)."""

    status_code: int
    content: bytes
    headers: httpx.Headers

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")

    def json(self):
        """The body as JSON; ValueError when it is none."""
        return jsonlimits.loads(self.content, JSON_DEPTH)


@dataclass
class RemoteResult:
    """One remote generation: ``text`` (stop string excluded), ``stop_reason`` (as
    :class:`assistd.decoding.engine.Generation`'s), ``tokens`` (ids of ``text`` when a
    tokenizer is known, else empty) and its ``ledger``."""

    text: str
    stop_reason: str
    tokens: list[int]
    ledger: Ledger


@dataclass
class RemoteLedger(Ledger):
    """A remote generation's ledger: what the server reported and the times assistd saw
    (``first_token_ms``, ``total_ms``), no acceptance figure (no draft was verified
    here). ``committed_tokens`` counts the server's tokens (its ``usage`` when it sends
    one, else one per streamed chunk); rounds and plain steps stay 0."""

    server_usage: dict = field(default_factory=dict)
    retries: int = 0
    tokens_from: str = "streamed chunks"  # where committed_tokens came from
    prompt_sent: str = "text"  # "token ids" where the server takes them, else "text"

    def as_dict(self) -> dict:
        # The server's usage, or None where it sent none (llama-cpp-python's stream):
        # committed_tokens then counts the streamed chunks, and "tokens_from" says so.
        return {**super().as_dict(), "target": "remote",
                "decoded_by": "the server (no local draft verification)",
                "server_usage": self.server_usage or None,
                "tokens_from": self.tokens_from, "retries": self.retries,
                "prompt_sent": self.prompt_sent}

    def summary(self) -> str:
        return (f"target=remote tokens={self.committed_tokens} prompt={self.prompt_tokens}"
                f" first_token={self.first_token_ms:.0f}ms total={self.total_ms:.0f}ms"
                + (f" retries={self.retries}" if self.retries else ""))


class _LlamaVocab:
    """A GGUF's tokenizer without its weights (llama.cpp ``vocab_only``); tokenizes and
    renders pieces as :class:`assistd.targets.llama.LlamaTarget` does (its methods)."""

    def __init__(self, path: Path):
        from assistd.targets.llama import LlamaTarget, check_model_file

        check_model_file(path)
        import llama_cpp

        # The model alone, no context: a context over a vocabulary without weights
        # only logs a warning about its training length.
        params = llama_cpp.llama_model_default_params()
        params.vocab_only = True
        llama_cpp.llama_backend_init()
        # llama-cpp-python's log callback prints llama.cpp's errors to stderr: the
        # user gets the one line below instead (as LlamaTarget's verbose=False does)
        quiet = logging.getLogger("llama-cpp-python")
        level = quiet.level
        quiet.setLevel(logging.CRITICAL + 1)
        try:
            self._model = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
        finally:
            quiet.setLevel(level)
        if not self._model:
            raise ModelError(f"failed to load model {path}: cannot read its vocabulary; pass"
                             " the GGUF of the server's model, or no --model (the server's"
                             " tokenizer is used)")
        self._lib, self._pieces = llama_cpp, {}
        self._vocab = vocab = llama_cpp.llama_model_get_vocab(self._model)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
        bos = llama_cpp.llama_vocab_bos(vocab)
        self.bos_token_id = bos if bos >= 0 else None
        self.add_bos = bool(llama_cpp.llama_vocab_get_add_bos(vocab))
        self.eos_token_ids = frozenset(i for i in range(self.n_vocab)
                                       if llama_cpp.llama_vocab_is_eog(vocab, i))
        self.fingerprint = tokenizer_fingerprint(
            llama_cpp.llama_vocab_get_text(vocab, i) or b"" for i in range(self.n_vocab))
        self._L = LlamaTarget

    def tokenize(self, text):
        return self._L.tokenize(self, text)

    def detokenize(self, ids, prev=None):
        return self._L.detokenize(self, ids, prev)

    def _piece(self, token):
        return self._L._piece(self, token)

    def pieces(self):
        return self._L.pieces(self)

    def special_ids(self):
        return self._L.special_ids(self)

    def fim_tokens(self):
        return self._L.fim_tokens(self)

    def text_of(self, ids: Sequence[int]) -> str:
        """``ids`` as the text a server's tokenizer (special tokens parsed) gives back:
        control tokens spelled out, unlike :meth:`detokenize`."""
        out = []
        for t in ids:
            buf = (ctypes.c_char * 256)()
            n = self._lib.llama_token_to_piece(self._vocab, int(t), buf, 256, 0, True)
            out.append(bytes(buf[:max(n, 0)]))
        return b"".join(out).decode("utf-8", errors="replace")

    def close(self):
        if self._model:
            self._lib.llama_model_free(self._model)
            self._model = None


class RemoteTarget(Target):
    """A model behind an OpenAI-compatible server at ``url``.

    ``key``: the bearer key (see :func:`read_key`), or None; ``key_file``: the file it
    came from, read again when it changes (a key rotated in place). ``model_name``: the
    ``model`` field sent (None: the server's first in ``/v1/models``, or none).
    ``tokenizer``: a GGUF whose vocabulary is the server model's (see the module), or
    None. ``n_ctx``: the server's context window, in its tokens (assistd cannot always
    ask). ``timeout_s``: the longest wait for the next streamed chunk (seconds).
    ``deadline_s``: the longest one generation may take, seconds (None: derived from
    its ``max_tokens``, :meth:`deadline_for`).
    ``ca_bundle``: a PEM file of CA certificates. ``context``: what a prompt may
    carry besides the document being completed: "all" (cross-file snippets of the
    scope's other open buffers, after the secret filter) or "file" (the document's own
    text only; :attr:`context` is read by the editor completer). ``fim``: the FIM
    layout: "auto" (see :meth:`fim_tokens`), "none", or a family of
    :data:`FIM_FAMILIES`. Raises :class:`InputError` for a bad URL, CA bundle,
    ``context`` or ``fim``; a server that is down is not an error here (status says
    so, and each generation tries again).
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
                 tokenizer: Path | str | None = None, n_ctx: int = 2048,
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
        verify = _ssl_context(ca_bundle, environ)  # bad input fails before anything opens
        self.model_path = self.url
        self.model_name = model_name
        self.n_ctx = int(n_ctx)
        self.timeout_s = float(timeout_s)
        self.deadline_s = None if deadline_s is None else float(deadline_s)
        if self.deadline_s is not None and not self.deadline_s > 0:
            raise InputError(f"target_deadline_ms must be positive, not {deadline_s!r}")
        self._overran = False  # the server streamed past max_tokens (said once)
        host = urlsplit(self.url).hostname or ""
        plain = self.url.startswith("http://") and not is_this_machine(host)
        if plain and host not in _warned_plain:
            _warned_plain.add(host)
            log.warning("warning: the remote Target %s is plain http:// on another host: prompts"
                        " (and the key) cross the network unencrypted; use https://", self.url)
        self._tokenizer_path = Path(tokenizer).expanduser() if tokenizer else None
        self._vocab = _LlamaVocab(self._tokenizer_path) if tokenizer else None
        auth = _KeyFile(key_file, key) if key_file else None
        self._auth, self._static_key = auth, None if auth else key
        headers = {"Authorization": f"Bearer {key}"} if key and not auth else {}
        headers["Accept-Encoding"] = "identity"  # bodies are capped as sent (no gzip bomb)
        self._keyed = bool(key or auth)
        self._http = httpx.Client(
            base_url=self.url, headers=headers, auth=auth, follow_redirects=False, trust_env=True,
            verify=verify,
            timeout=httpx.Timeout(self.timeout_s, connect=min(CONNECT_TIMEOUT_S, self.timeout_s)))
        self._mode = "model" if self._vocab else None  # "model" | "server" | "chars"
        self._fim = _UNDECIDED  # (prefix, suffix, middle) ids or None, once decided
        self._fim_text: dict[int, str] = {}  # assistd's own marker ids -> their text
        self._controls = None  # (control ids, their spellings), read from the GGUF once
        self._tok_path = None  # the server's tokenize endpoint, once found
        # Server mode: spellings of CONTROL_SHAPE classified by the server: the control
        # tokens (spelling -> id, and back), and those it reads as ordinary text.
        self._learned: dict[str, int] = {}
        self._learned_text: dict[int, str] = {}
        self._ordinary: dict[str, None] = {}  # (a dict: insertion-ordered, trimmed oldest first)
        self._sentinel: list[int] | None = None  # the server's ids of _SENTINEL
        self._takes_ids: bool | None = None  # whether /v1/completions takes token ids
        self._plain_tokenize = False  # the server honours parse_special: false (llama.cpp's)
        v = self._vocab
        self.n_vocab = v.n_vocab if v else 0x110000  # else ids are (at most) code points
        self.bos_token_id = v.bos_token_id if v else None
        self.add_bos = v.add_bos if v else False
        self.eos_token_ids = v.eos_token_ids if v else frozenset()
        self.fingerprint = v.fingerprint if v else tokenizer_fingerprint(
            [b"assistd remote tokenizer", self.url.encode(), (model_name or "").encode()])
        self.state = {"reachable": None, "model": self._shown(model_name), "latency_ms": None,
                      "last_error": None, "checked_at": None,
                      "model_listed": None}  # --target-model among the server's models
        self._lock = threading.RLock()  # (fim_tokens holds it while the tokenizer is found)
        self._prober: threading.Thread | None = None
        self.probe()

    @property
    def local_tokenizer(self) -> bool:
        """Whether tokenizing stays on this machine (a tokenizer GGUF was given): else
        text to tokenize goes to the server, so the daemon keeps the history's watcher
        off (:func:`assistd.serving.daemon.serve`) and editors' buffers are not indexed."""
        return self._vocab is not None

    def __repr__(self) -> str:
        return f"RemoteTarget({self.url!r}, model={self.display_model!r}, tokenizer={self._mode!r})"

    @property
    def display_model(self) -> str | None:
        """The model's name as shown (status, the daemon's ``/v1/models``, the log): the
        server's id with the key replaced and control characters escaped, at most
        :data:`ERROR_CHARS` characters. Requests send :attr:`model_name` as it came."""
        return self._shown(self.model_name)

    def _shown(self, text) -> str | None:
        """Text that came from the server, fit to be shown (see :attr:`display_model`)."""
        return None if text is None else printable(self._redact(str(text)))[:ERROR_CHARS]

    def deadline_for(self, max_tokens: int) -> float:
        """The deadline of one generation of ``max_tokens``, seconds from its start:
        ``deadline_s`` when configured, else ``timeout_s + max_tokens /``
        :data:`DEADLINE_TOKENS_PER_S` (the first chunk within the read timeout, then 1
        token a second at the least: 30 s + 64 s for 64 tokens by default)."""
        if self.deadline_s is not None:
            return self.deadline_s
        return self.timeout_s + max(1, int(max_tokens)) / DEADLINE_TOKENS_PER_S

    # -- capped requests -------------------------------------------------------

    def _fetch(self, method: str, path: str, timeout: float | None = None, **kw) -> _Answer:
        """One request whose answer is read to its cap: :data:`MAX_BODY_BYTES` for a 200
        (more raises :class:`RemoteTargetError` "too_large"), :data:`MAX_ERROR_BYTES` of
        an error (the rest is not read), all within ``timeout`` seconds (default
        ``timeout_s``; past it: "deadline"). Raises ``httpx.HTTPError`` as httpx does."""
        limit = self.timeout_s if timeout is None else timeout
        end = time.monotonic() + limit
        with self._http.stream(method, path, timeout=httpx.Timeout(
                limit, connect=min(CONNECT_TIMEOUT_S, limit)), **kw) as r:
            body = self._read_capped(r, end, path, limit)
        return _Answer(r.status_code, body, r.headers)

    def _read_capped(self, r: httpx.Response, end: float, what: str, limit: float) -> bytes:
        ok = r.status_code == 200
        cap = MAX_BODY_BYTES if ok else MAX_ERROR_BYTES
        if r.headers.get("content-encoding", "identity").lower() not in ("identity", ""):
            if not ok:
                return b""  # an error's detail we did not ask to decompress: left out
            raise RemoteTargetError(
                f"the remote Target {self.url} answered {what} compressed"
                f" ({self._shown(r.headers['content-encoding'])!r}) although asked for identity",
                "malformed")
        buf = bytearray()
        for data in r.iter_raw():
            buf += data
            if len(buf) > cap:
                if not ok:
                    return bytes(buf[:cap])
                raise RemoteTargetError(f"the remote Target {self.url} answered {what} with"
                                        f" more than {cap // (1 << 20)} MiB; the rest was not"
                                        " read", "too_large")
            if time.monotonic() > end:
                raise RemoteTargetError(f"the remote Target {self.url} did not finish its"
                                        f" answer to {what} within {limit:g} s",
                                        "deadline")
        return bytes(buf)

    # -- health ----------------------------------------------------------------

    def probe(self) -> dict:
        """``GET /v1/models`` now: updates and returns :meth:`status`' state (reachable,
        the model id, the latency in ms, the last error). Never raises."""
        t0 = time.perf_counter()
        try:
            r = self._fetch("GET", "/v1/models", timeout=min(CONNECT_TIMEOUT_S, self.timeout_s))
            ms = (time.perf_counter() - t0) * 1000
            if r.status_code != 200:
                raise RemoteTargetError(self._http_message(r.status_code, r.text, r.headers),
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
                                self.url, ", ".join(map(self._shown, ids[:5])), self.display_model)
            self._fit_context(next((m for m in data if m.get("id") == self.model_name),
                                   data[0] if data else {}))
            self._seen(ms, model=self.display_model or (self._shown(ids[0]) if ids else None))
        except httpx.HTTPError as e:
            self._failed(self._transport_message(e))
        except RemoteTargetError as e:
            self._failed(str(e), answered=True)
        except Exception as e:  # noqa: BLE001 - a probe never raises: status shows it
            self._failed(printable(self._redact(
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

    # -- tokenizer ---------------------------------------------------------------

    def _tokenizer(self) -> str:
        """The tokenizer mode, found on first use (the server must answer then)."""
        if self._mode is None:
            with self._lock:
                if self._mode is None:
                    self._find_tokenizer()
        return self._mode

    def _find_tokenizer(self) -> None:
        for path in ("/extras/tokenize", "/tokenize"):
            try:
                r = self._fetch("POST", path, json=self._tok_body("a"))
            except httpx.HTTPError as e:
                raise RemoteTargetError(self._transport_message(e)) from None
            if r.status_code == 200 and isinstance(self._ids_of(r), list):
                self._mode, self._tok_path = "server", path
                log.info("remote Target %s: prompt budgets use the server's %s", self.url, path)
                return
            if r.status_code not in (200, 404, 405):  # a refused key, a failing server:
                raise RemoteTargetError(self._http_message(r.status_code, r.text, r.headers),
                                        "http")
        self._mode = "chars"  # (not decided on an error: it would stick)
        log.warning("remote Target %s has no tokenize endpoint and no --model tokenizer was"
                    " given: prompt budgets count %d characters per token", self.url,
                    CHARS_PER_TOKEN)

    def _tok_body(self, text: str) -> dict:
        # llama-cpp-python reads "input", llama.cpp "content", vLLM "prompt".
        body = {"input": text, "content": text, "prompt": text, "add_special": False,
                "add_special_tokens": False}
        if self.model_name:
            body["model"] = self.model_name
        return body

    @staticmethod
    def _ids_of(r: _Answer) -> list[int] | None:
        """The ids of a tokenize answer (ints, or objects with an ``id``), or None when
        it holds anything else."""
        try:
            toks = r.json().get("tokens")
        except (ValueError, AttributeError):
            return None
        if not isinstance(toks, list):
            return None
        ids = [t.get("id") if isinstance(t, dict) else t for t in toks]
        ok = all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < 1 << 31 for i in ids)
        return ids if ok else None

    @property
    def chars_per_token(self) -> int:
        """Characters one prompt token stands for: 1, or :data:`CHARS_PER_TOKEN` when
        ids are characters (no tokenizer known)."""
        return CHARS_PER_TOKEN if self._tokenizer() == "chars" else 1

    def tokenize(self, text: str) -> list[int]:
        """``text`` -> the server model's ids, control-token spellings as plain text (the
        :class:`Target` contract): the GGUF's tokenizer, else the server's (asked about
        spellings of a control token's shape first: :meth:`_classify`), else one id per
        character. Raises :class:`RemoteTargetError` when the server cannot answer."""
        mode = self._tokenizer()
        if mode == "model":
            return self._vocab.tokenize(text)
        if mode == "chars":
            return [ord(c) for c in encodable(text)]
        text = encodable(text)
        controls = [m for m in self._classify(text) if m in text]
        if self._plain_tokenize:  # the server tokenizes plain text when asked
            return self._server_ids(text, parse_special=False)
        if not controls:
            return self._server_ids(text)
        # Control spellings as text: each one's first character tokenized apart from the
        # rest, so that the server cannot read it whole (the ids spell the same text).
        pattern = re.compile("|".join(map(re.escape, sorted(controls, key=len, reverse=True))))
        ids, pos = [], 0
        for m in pattern.finditer(text):
            ids += self._server_ids(text[pos:m.start() + 1])  # up to its first character
            pos = m.start() + 1
        return ids + self._server_ids(text[pos:])

    def _server_ids(self, text: str, parse_special: bool = True) -> list[int]:
        """The server's tokenization of ``text``: control spellings parsed (see
        :meth:`tokenize`), or not where ``parse_special`` is False and the server honours
        it (llama.cpp's ``/tokenize`` does; llama-cpp-python's always parses them)."""
        if not text:
            return []
        try:
            r = self._fetch("POST", self._tok_path, json={**self._tok_body(text),
                                                          "parse_special": parse_special})
        except httpx.HTTPError as e:
            raise RemoteTargetError(self._transport_message(e)) from None
        ids = self._ids_of(r) if r.status_code == 200 else None
        if ids is None:
            raise RemoteTargetError(f"the remote Target {self.url} could not tokenize"
                                    f" ({self._http_message(r.status_code, r.text, r.headers)})",
                                    "http" if r.status_code != 200 else "malformed")
        return ids

    def _classify(self, text: str) -> dict[str, int]:
        """Server mode: ask the server about each spelling in ``text`` that looks like a
        control token (:data:`CONTROL_SHAPE`) and was not asked about yet; returns the
        control tokens learned so far (spelling -> id). A spelling is a control token when
        the server tokenizes it as one id, and either tokenizes it otherwise with
        ``parse_special`` false (llama.cpp's server) or its detokenizer leaves that id out
        (llama.cpp renders control tokens as nothing unless asked; llama-cpp-python's
        ``/extras/detokenize`` does not ask). A server that does neither teaches nothing
        here: its prompts stay as they were (README, "Known limit")."""
        for m in dict.fromkeys(CONTROL_SHAPE.findall(text)):
            if m in self._learned or m in self._ordinary:
                continue
            ids = self._server_ids(m)
            plain = self._server_ids(m, parse_special=False) if len(ids) == 1 else ids
            if plain != ids:
                self._plain_tokenize = True
            if len(ids) == 1 and ids[0] not in self._learned_text and (
                    plain != ids or self._detokenize_server(ids) == ""):
                self._learned[m], self._learned_text[ids[0]] = ids[0], m
            else:
                self._ordinary[m] = None
                if len(self._ordinary) > SHAPES_KEPT:
                    del self._ordinary[next(iter(self._ordinary))]
        return self._learned

    def control_spellings(self, text: str = "") -> dict[str, int]:
        """The GGUF's control tokens with ``--model``; else those the server taught so
        far, after asking it about ``text``'s (:meth:`_classify`); none in character mode."""
        mode = self._tokenizer()
        if mode == "model":
            return super().control_spellings(text)
        if mode == "server":
            return self._classify(encodable(text))
        return {}

    def detokenize(self, ids: Sequence[int], prev: Sequence[int] | None = None) -> str:
        mode = self._tokenizer()
        if mode == "model":
            return self._vocab.detokenize(ids, prev)
        if mode == "chars":
            return "".join(map(chr, ids))
        return self._detokenize_server(ids)

    def _detokenize_server(self, ids: Sequence[int]) -> str:
        path = self._tok_path.replace("tokenize", "detokenize")
        try:
            model = {"model": self.model_name} if self.model_name else {}
            r = self._fetch("POST", path, json={"tokens": [int(i) for i in ids], **model})
            data = r.json() if r.status_code == 200 else None
        except httpx.HTTPError as e:
            raise RemoteTargetError(self._transport_message(e)) from None
        except ValueError as e:
            raise RemoteTargetError(f"the remote Target {self.url} could not detokenize:"
                                    f" {self._shown(e)}", "malformed") from None
        text = next((data[k] for k in ("text", "content", "prompt")
                     if isinstance(data, dict) and isinstance(data.get(k), str)), None)
        if text is None:
            raise RemoteTargetError(f"the remote Target {self.url} could not detokenize"
                                    f" (HTTP {r.status_code})",
                                    "http" if r.status_code != 200 else "malformed")
        return text

    def prompt_text(self, ids: Sequence[int]) -> str:
        """The prompt to send for ``ids``: a leading BOS dropped when the model adds one
        (the server adds its own), control tokens spelled out so that the server parses
        them back (SmolLM2's BOS is also its chat turn marker, so it must stay)."""
        ids = list(ids)
        if ids and self.add_bos and ids[0] == self.bos_token_id:
            ids = ids[1:]
        mode = self._tokenizer()
        render = (self._text_of if mode == "model" else self._server_text if mode == "server"
                  else self.detokenize)
        if not self._fim_text or not any(i in self._fim_text for i in ids):
            return render(ids)
        out, run = [], []  # FIM markers of assistd's own: spelled out between the runs
        for i in ids + [None]:
            if i is None or i in self._fim_text:
                if run:
                    out.append(render(run))
                    run = []
                if i is not None:
                    out.append(self._fim_text[i])
            else:
                run.append(i)
        return "".join(out)

    def _text_of(self, ids: list[int]) -> str:
        """``ids`` as text for a server that parses control tokens in it: each control
        token spelled out, and a control token's spelling inside plain text (a message
        that writes ``<|im_start|>``, tokenized here as text) defused with a zero-width
        space after its first character, so the server reads it as text too, as the
        local Target does. Without the GGUF (the server tokenizes) this is not possible:
        README, "Known limit"."""
        if self._controls is None:
            special = self._vocab.special_ids()
            self._controls = (special, sorted({m for m in (self._vocab.text_of([i]) for i in special)
                                               if len(m) > 1}, key=len, reverse=True))
        special, marks = self._controls
        out, run = [], []
        for i in ids + [None]:
            if i is None or i in special:
                if run:
                    out.append(defuse(self._vocab.text_of(run), marks))
                    run = []
                if i is not None:
                    out.append(self._vocab.text_of([i]))
            else:
                run.append(i)
        return "".join(out)

    def prompt_ids(self, ids: Sequence[int]) -> list[int] | None:
        """The prompt to send as the server's own token ids, for a server that takes
        them (:meth:`takes_token_ids`): ``ids`` as a local Target would evaluate them
        (nothing is tokenized again there, so no text can become a control token), with
        assistd's FIM markers as the server vocabulary's. None when the ids are not the
        server's: character mode, or a FIM family the vocabulary has no markers for."""
        if self._tokenizer() == "chars":
            return None
        out = []
        for i in ids:
            if i in self._fim_text:
                marker = self._fim_text[i]
                i = self.control_spellings(marker).get(marker)
                if i is None:
                    return None
            out.append(int(i))
        return out

    def takes_token_ids(self) -> bool:
        """Whether the server's ``/v1/completions`` takes a prompt of token ids (vLLM
        and llama.cpp's ``llama-server`` do; llama-cpp-python's server takes text only
        and answers 500 with a validation error). Asked once, with a one-token prompt
        and ``max_tokens`` 1; a server that cannot be asked now (down, refusing the key,
        busy) is asked again on the next generation, which goes as text meanwhile."""
        if self._takes_ids is None and self._tokenizer() != "chars":
            try:
                probe = {"prompt": self.tokenize("a")[:1], "max_tokens": 1, "temperature": 0.0,
                         **({"model": self.model_name} if self.model_name else {})}
                r = self._fetch("POST", "/v1/completions", json=probe)
            except (httpx.HTTPError, RemoteTargetError):
                return False
            if r.status_code in (400, 422, 500):
                self._takes_ids = False
                log.info("remote Target %s takes text prompts only (HTTP %d to token ids):"
                         " control-token spellings in text are defused", self.url, r.status_code)
            elif r.status_code == 200:
                self._takes_ids = True
                log.info("remote Target %s takes token-id prompts: they are sent as ids", self.url)
        return bool(self._takes_ids)

    def _server_text(self, ids: list[int]) -> str:
        """``ids`` as text for the server, without a local tokenizer: the control tokens
        the server taught (:meth:`_classify`) spelled out, and their spellings inside the
        text between them defused (:func:`defuse`), as :meth:`_text_of` does with the
        GGUF. One detokenize request: each control token stands in as :data:`_SENTINEL`."""
        controls = [i for i in ids if i in self._learned_text]
        if not controls:
            return defuse(self._detokenize_server(ids), self._learned)
        if self._sentinel is None:
            self._sentinel = self._server_ids(_SENTINEL)
        joined = [t for i in ids for t in (self._sentinel if i in self._learned_text else (i,))]
        parts = self._detokenize_server(joined).split(_SENTINEL)
        if len(parts) != len(controls) + 1:  # the text holds the sentinel itself
            parts, run = [], []
            for i in ids:
                if i in self._learned_text:
                    parts.append(self._detokenize_server(run) if run else "")
                    run = []
                else:
                    run.append(i)
            parts.append(self._detokenize_server(run) if run else "")
        for text in parts:  # spellings the pieces form together are asked about too
            self._classify(text)
        out = [defuse(parts[0], self._learned)]
        for i, text in zip(controls, parts[1:]):
            out += [self._learned_text[i], defuse(text, self._learned)]
        return "".join(out)

    def prompt_tokens(self, ids: Sequence[int]) -> int:
        """Server tokens the prompt ``ids`` stands for (characters / 4 in char mode)."""
        return math.ceil(len(ids) / self.chars_per_token)

    def pieces(self) -> list[bytes]:
        # Unknown vocabulary: one placeholder as long as a token's text may be, so that
        # byte-size checks stay lenient.
        return self._vocab.pieces() if self._vocab else [b"\0" * 64]

    def special_ids(self) -> frozenset[int]:
        return self._vocab.special_ids() if self._vocab else frozenset(self._learned_text)

    def fim_tokens(self) -> tuple[int, int, int] | None:
        """The FIM ids ``(prefix, suffix, middle)``, or None (prefix-only prompts).

        ``fim`` "none": None. A family: ids of assistd's own above the vocabulary, which
        :meth:`prompt_text` spells as the family's markers. "auto": the tokenizer GGUF's
        declared FIM tokens when ``--model`` names one; else the server's tokenizer: the
        first family whose three markers it tokenizes as one token each (llama.cpp's
        ``/tokenize`` and llama-cpp-python's ``/extras/tokenize`` parse special tokens;
        ``/props`` and ``/v1/models`` say nothing of FIM); else None, said once in the
        log. Decided on first use; while the server cannot be asked, None for now."""
        if self._fim is _UNDECIDED:
            with self._lock:
                if self._fim is _UNDECIDED:
                    self._fim = self._find_fim()
        return None if self._fim is _UNDECIDED else self._fim

    def _markers(self, family: str) -> tuple[int, int, int]:
        base = self.n_vocab  # above every id a tokenizer gives (code points in char mode)
        self._fim_text = {base + i: m for i, m in enumerate(FIM_FAMILIES[family])}
        return (base, base + 1, base + 2)

    def _find_fim(self):
        if self.fim == "none":
            return None
        if self.fim != "auto":
            log.info("remote Target %s: FIM layout %s (configured)", self.url, self.fim)
            return self._markers(self.fim)
        if self._vocab is not None:
            ids = self._vocab.fim_tokens()
            if ids is None:
                log.info("remote Target %s: the tokenizer GGUF declares no FIM tokens: prompts"
                         " are prefix-only (set target_fim to a family if the model has FIM)",
                         self.url)
            return ids
        try:
            mode = self._tokenizer()
            if mode == "server":
                for family, markers in FIM_FAMILIES.items():
                    if all(len(self._server_ids(m)) == 1 for m in markers):
                        log.info("remote Target %s: FIM layout %s (the server's tokenizer has"
                                 " its markers)", self.url, family)
                        return self._markers(family)
        except RemoteTargetError:
            return _UNDECIDED  # asked again on the next request
        log.info("remote Target %s: %s: prompts are prefix-only (set target_fim to a family"
                 " if the model has FIM)", self.url,
                 "its tokenizer knows no FIM markers" if mode == "server"
                 else "no tokenizer to read FIM markers from")
        return None

    def chat_template(self) -> str | None:
        """The tokenizer GGUF's template (the base class reads ``model_path``: the URL)."""
        if self._tokenizer_path is None:
            return None
        from assistd.targets.gguf_header import gguf_metadata

        try:
            return gguf_metadata(self._tokenizer_path, {"tokenizer.chat_template"}).get(
                "tokenizer.chat_template")
        except Exception:  # noqa: BLE001 - unreadable: no template, as the base class
            return None

    # -- no local evaluation ---------------------------------------------------------

    def _evaluate(self, tokens, rows, n_past):
        raise RuntimeError("a remote Target has no local KV cache to evaluate on")

    def _truncate(self, n: int) -> None:
        pass

    # -- generation --------------------------------------------------------------

    def complete(self, prompt: Sequence[int], *, max_tokens: int, sampling=None,
                 stop: Sequence[str] = (), stop_at: Callable[[str], int | None] | None = None,
                 cancelled: Callable[[], bool] | None = None,
                 between_rounds: Callable[[], bool] | None = None) -> RemoteResult:
        """Stream one completion of ``prompt`` (token ids) from ``/v1/completions``.

        ``stop`` strings and ``stop_at`` (the engine's contract: called with the text so
        far, returns where it ends or None) are applied here, on the text, and end the
        stream; ``cancelled()`` is polled every :data:`POLL_S` s and between chunks and
        ends it with ``"cancelled"``; ``between_rounds()`` is called while waiting (the
        daemon's preemption). Reading stops at ``max_tokens`` worth of text (stop reason
        ``"max_tokens"``, see the module), and with an error of kind "deadline" at
        :meth:`deadline_for` or when no text came for twice ``timeout_s`` (a stream of
        keep-alives or empty chunks never trips the socket's read timeout, which ends a
        silent one at ``timeout_s``). Raises
        :class:`InputError` when the prompt does not fit ``n_ctx`` or the server refuses
        it (HTTP 400), :class:`RemoteTargetError` for the rest, its ``kind`` saying which
        (see the module for the retry policy)."""
        n_prompt = self.prompt_tokens(prompt)
        if n_prompt + 1 >= self.n_ctx:
            raise InputError(f"the prompt is {n_prompt} tokens; the context window is {self.n_ctx}")
        max_tokens = int(max_tokens)
        ledger = RemoteLedger(prompt_tokens=n_prompt)
        t0 = time.perf_counter()
        limit = self.deadline_for(max_tokens)
        deadline = time.monotonic() + limit
        sent = self.prompt_ids(prompt) if self.takes_token_ids() else None
        ledger.prompt_sent = "text" if sent is None else "token ids"
        body = {"prompt": self.prompt_text(prompt) if sent is None else sent,
                "max_tokens": max_tokens,
                "stream": True, "stream_options": {"include_usage": True}, "echo": False,
                **_sampling_fields(sampling)}
        if self.model_name:
            body["model"] = self.model_name
        stops = [s for s in stop if s]
        longest = max((len(s) for s in stops), default=0)
        max_chars = max_tokens * MAX_TOKEN_CHARS
        text, chunks, reason, scanned = "", 0, None, 0
        for attempt in range(RETRIES + 1):
            ledger.retries = attempt
            sent = time.perf_counter()
            stream = _Stream(self, body)
            quiet_until = time.monotonic() + 2 * self.timeout_s  # no text by then: an error
            try:
                while reason is None:
                    ev = stream.next(cancelled, between_rounds, min(deadline, quiet_until))
                    if ev is None:
                        reason = "cancelled"
                        break
                    kind = ev[0]
                    if kind == "deadline":
                        if time.monotonic() >= deadline:
                            self._past_deadline(limit, max_tokens, chunks)
                        self._no_text(chunks)
                    if kind == "open":
                        self._seen((time.perf_counter() - sent) * 1000)
                        continue
                    if kind == "text":
                        piece, finish, usage = ev[1], ev[2], ev[3]
                        if usage:
                            ledger.server_usage = usage
                        if piece:
                            quiet_until = time.monotonic() + 2 * self.timeout_s
                            if chunks >= max_tokens:  # the server ignores max_tokens
                                self._overrun(max_tokens)
                                reason = "max_tokens"
                                break
                            if len(text) + len(piece) > max_chars:  # more than it holds
                                piece = piece[:max_chars - len(text)]
                                self._overrun(max_tokens)
                                finish = "length"
                            if not chunks:
                                ledger.first_token_ms = (time.perf_counter() - t0) * 1000
                            chunks += 1
                            text += piece
                            if stops:
                                start = max(0, scanned - longest + 1)
                                hits = [i for i in (text.find(s, start) for s in stops) if i >= 0]
                                scanned = len(text)
                                if hits:
                                    text, reason = text[:min(hits)], "stop"
                                    break
                            if stop_at is not None and (cut := stop_at(text)) is not None:
                                text, reason = text[:cut], "stop"
                                break
                        if finish:
                            reason = "max_tokens" if finish == "length" else "eos"
                        continue
                    if kind == "done":
                        # The stream ended without a finish reason: a server that failed
                        # before (or while) writing its answer, never an empty completion
                        # (one that has nothing to say still finishes with "stop").
                        if reason is None:
                            skipped = ev[1]
                            what = (f"after {chunks} {'chunk' if chunks == 1 else 'chunks'}"
                                    if chunks else "before any completion")
                            bad = (f" ({skipped} unreadable {'event' if skipped == 1 else 'events'}"
                                   " skipped)" if skipped else "")
                            raise RemoteTargetError(
                                f"the remote Target {self.url} closed the stream {what}"
                                f" without finishing{bad}; the completion was dropped"
                                " (nothing was stored)", "malformed")
                        break
                    if kind == "error":  # (kind, retryable, wait_s, the exception, whether
                        _, retryable, wait, exc, answered = ev  # it is an HTTP answer)
                        if chunks:
                            raise type(exc)(*_with(exc, (
                                f"{exc}, after {chunks} {'chunk' if chunks == 1 else 'chunks'}"
                                " of text: the completion"
                                " was dropped (nothing was stored)")))
                        pause = wait if wait is not None else BACKOFF_S[min(attempt, 1)]
                        if (retryable and attempt < RETRIES and (wait or 0) <= RETRY_AFTER_MAX_S
                                and time.monotonic() + pause < deadline):
                            self._failed(str(exc), answered)
                            if not _sleep(pause, cancelled):
                                reason = "cancelled"
                            break
                        if (retryable and wait is not None and wait <= RETRY_AFTER_MAX_S
                                and time.monotonic() + wait >= deadline):
                            exc = type(exc)(*_with(exc, f"{exc}; it asks to wait {wait:g} s,"
                                                        f" past the deadline of {limit:g} s"))
                        self._failed(str(exc), answered)
                        raise type(exc)(*_with(exc, str(exc) + (
                            f" (after {attempt} retries)" if attempt else "")))
            finally:
                stream.close()
            if reason is not None:
                break
        ledger.total_ms = (time.perf_counter() - t0) * 1000
        tokens = []
        if self._mode in ("model", "server") and text:
            try:  # the text's ids (the server streams text): for counts, not decoding
                tokens = self.tokenize(text)
            except RemoteTargetError:
                pass  # the server left after answering: the answer stands
        # The server's tokens: its usage; else the limit it stopped at; else the text's
        # tokens; else one per chunk (a chunk may hold several tokens, or part of one).
        ledger.committed_tokens, ledger.tokens_from = next(
            (n, src) for n, src in (
                (ledger.server_usage.get("completion_tokens"), "server usage"),
                (max_tokens if reason == "max_tokens" else None, "max_tokens reached"),
                (len(tokens) if tokens else None, "the text tokenized"),
                (chunks, "streamed chunks")) if isinstance(n, int))
        if reason == "eos" and self.eos_token_ids:
            tokens.append(min(self.eos_token_ids))
        return RemoteResult(text=text, stop_reason=reason, tokens=tokens, ledger=ledger)

    def _past_deadline(self, limit: float, max_tokens: int, chunks: int):
        why = ("target_deadline_ms" if self.deadline_s is not None else
               f"{self.timeout_s:g} s + {max_tokens} tokens at {DEADLINE_TOKENS_PER_S:g} tokens/s")
        message = (f"the remote Target {self.url} did not finish within the deadline of"
                   f" {limit:g} s ({why}) after {chunks} {'chunk' if chunks == 1 else 'chunks'};"
                   " the completion was dropped (nothing was stored); a slow server needs a"
                   " larger --target-deadline-ms (target_deadline_ms)")
        self._failed(message, answered=chunks > 0)
        raise RemoteTargetError(message, "deadline")

    def _no_text(self, chunks: int):
        message = (f"the remote Target {self.url} sent no text for {2 * self.timeout_s:g} s"
                   + (f" after {chunks} {'chunk' if chunks == 1 else 'chunks'}" if chunks else "")
                   + " (only keep-alives or empty chunks); the completion was dropped (nothing"
                   " was stored); the server may be overloaded: check it, or raise"
                   " --target-timeout-ms (target_timeout_ms)")
        self._failed(message, answered=True)
        raise RemoteTargetError(message, "deadline")

    def _overrun(self, max_tokens: int) -> None:
        if not self._overran:  # said once: the server ignores the limit it was sent
            self._overran = True
            log.warning("warning: the remote Target %s streamed more than max_tokens (%d)"
                        " worth of text: the rest was not read", self.url, max_tokens)

    # -- messages ------------------------------------------------------------------

    def _transport_message(self, e: Exception) -> str:
        if isinstance(e, httpx.ConnectTimeout):
            return (f"the remote Target {self.url} did not accept a connection within"
                    f" {min(CONNECT_TIMEOUT_S, self.timeout_s):g} s; check the URL and the network")
        tls = _tls_failure(e) if isinstance(e, httpx.ConnectError) else None
        if isinstance(tls, ssl.SSLCertVerificationError):
            return (f"the remote Target {self.url}'s certificate did not verify"
                    f" ({tls.verify_message or tls.reason}); pass its CA with"
                    " --target-ca-bundle FILE (target_ca_bundle)")
        if tls is not None:
            return (f"the TLS handshake with the remote Target {self.url} failed"
                    f" ({tls.reason or type(tls).__name__}); the server may speak plain http:"
                    f" try http://{self.url.split('://', 1)[1]}")
        if isinstance(e, httpx.ConnectError):
            return (f"the remote Target {self.url} does not answer (connection refused or"
                    " unreachable); is the server running?")
        if isinstance(e, httpx.TimeoutException):
            return (f"the remote Target {self.url} sent nothing for {self.timeout_s:g} s (read"
                    " timeout); the server may be overloaded: check it, or raise"
                    " --target-timeout-ms (target_timeout_ms)")
        if isinstance(e, httpx.ProxyError):
            return f"the proxy for {self.url} refused the connection: {type(e).__name__}"
        return f"the connection to the remote Target {self.url} broke ({type(e).__name__})"

    def _redact(self, text: str) -> str:
        """``text`` without the key, nor any piece of it of :data:`KEY_PIECE` characters
        or more: a server may quote the request back (whole, or cut) in its error, a
        header or a model id. Call it before anything cuts the text."""
        key = self._auth.key if getattr(self, "_auth", None) is not None else getattr(
            self, "_static_key", None)
        return redact_key(text, key)

    def _http_message(self, code: int, body: str, headers) -> str:
        detail = _error_detail(body, self._redact)
        if 300 <= code < 400:
            return (f"the remote Target {self.url} answered with a redirect (HTTP {code});"
                    " assistd does not follow redirects, so that the key goes only to the"
                    " configured URL: set --target-url to the server's own address")
        if code in (401, 403) and not self._keyed:
            return (f"the remote Target {self.url} wants an API key (HTTP {code}) and none was"
                    " sent: put it in a file only you can read (chmod 600) and pass"
                    f" --target-key-file FILE (target_key_file), or set ${KEY_ENV}")
        if code in (401, 403):
            return (f"the remote Target {self.url} refused the key (HTTP {code}); check"
                    f" --target-key-file or ${KEY_ENV}")
        if code == 404:
            return (f"the remote Target {self.url} has no such endpoint (HTTP 404{detail});"
                    " is --target-url the server's base URL (e.g. http://host:8080)?")
        if code == 429:
            wait = _retry_after(headers)  # a number, or not said (it is the server's text)
            return (f"the remote Target {self.url} is rate limiting (HTTP 429"
                    + (f", Retry-After {wait:g} s" if wait is not None else "") + ")")
        return f"the remote Target {self.url} failed (HTTP {code}{detail})"

    def close(self) -> None:
        self._http.close()
        if self._vocab is not None:
            self._vocab.close()
            self._vocab = None


def _tls_failure(e: BaseException) -> ssl.SSLError | None:
    """The TLS error behind ``e`` (httpx keeps it as the cause or context; its
    ``reason`` is e.g. ``"WRONG_VERSION_NUMBER"``), or None when there is none."""
    seen = 0
    while e is not None and seen < 8:
        if isinstance(e, ssl.SSLError):
            return e
        e, seen = e.__cause__ or e.__context__, seen + 1
    return None


def redact_key(text: str, key: str | None) -> str:
    """``text`` with ``key``, and every piece of it of :data:`KEY_PIECE` characters or
    more, replaced by ``[the key]``.

    >>> redact_key("a sk-0123456789 b 01234567 c", "sk-0123456789")
    'a [the key] b [the key] c'
    """
    if not key or not text:
        return text
    text = text.replace(key, "[the key]")
    n = min(KEY_PIECE, len(key))
    pieces = {key[i:i + n] for i in range(len(key) - n + 1)}
    hits = [i for i in range(len(text) - n + 1) if text[i:i + n] in pieces]
    if not hits:
        return text
    out, pos, end = [], 0, -1
    for i in hits + [None]:  # runs of overlapping pieces become one [the key]
        if i is not None and i <= end:
            end = i + n
            continue
        if end >= 0:
            out.append("[the key]")
            pos = end
        if i is not None:
            out.append(text[pos:i])
            end = i + n
    return "".join(out) + text[pos:]


def _retry_after(headers) -> float | None:
    """A ``Retry-After`` of seconds (0 up to a day), else None (a date, or junk)."""
    try:
        wait = float(headers.get("retry-after") or "")
    except ValueError:
        return None
    return wait if 0 <= wait <= 86400 else None


def _error_detail(body: str, redact=lambda t: t) -> str:
    """The server's own error message, short: ``": message"`` or ``""``; ``redact``
    runs on it before it is cut to :data:`ERROR_CHARS` (a key on the cut would show in
    part), control characters escaped after."""
    try:
        data = jsonlimits.loads(body, JSON_DEPTH)
        msg = data.get("error", data.get("detail", ""))
        msg = msg.get("message", "") if isinstance(msg, dict) else msg
    except (ValueError, AttributeError):
        msg = body
    msg = printable(" ".join(redact(str(msg)).split())[:ERROR_CHARS])
    return f": {msg}" if msg else ""


def _sampling_fields(s) -> dict:
    """assistd's sampling parameters as the servers name them (llama.cpp's
    ``repeat_penalty``, vLLM's ``repetition_penalty``; ``top_k`` 0 and ``min_p`` 0 are
    off, against llama.cpp's defaults of 40 and 0.05); greedy is temperature 0."""
    from assistd.ground.sampling import GREEDY

    s = GREEDY if s is None else s
    out = {"temperature": float(s.temperature), "top_p": float(s.top_p), "top_k": int(s.top_k),
           "min_p": 0.0, "repeat_penalty": float(s.repetition_penalty),
           "repetition_penalty": float(s.repetition_penalty)}
    if s.seed is not None:
        out["seed"] = int(s.seed)
    return out


def _sleep(seconds: float, cancelled) -> bool:
    """Wait ``seconds``; False as soon as ``cancelled()`` turns true."""
    end = time.monotonic() + max(0.0, seconds)
    while time.monotonic() < end:
        if cancelled is not None and cancelled():
            return False
        time.sleep(min(POLL_S, max(0.0, end - time.monotonic())))
    return True


class _Stream:
    """One streamed request, read on its own thread into a bounded queue, so that the
    caller can poll ``cancelled()`` and the deadline while the server is silent and leave
    at once. Closing it shuts the socket down (a reader blocked in ``recv`` wakes: a
    plain ``close`` from another thread would not wake it), so the server sees the client
    hang up. Events: ``("open",)``, ``("text", piece, finish, usage)``, ``("done",
    skipped)``, ``("error", retryable, wait_s, exception, answered)``."""

    def __init__(self, target: RemoteTarget, body: dict):
        self.target = target
        self.q: queue.Queue = queue.Queue(QUEUE_EVENTS)
        self.stop = threading.Event()
        self.finished = threading.Event()  # the reader closed the connection
        self.sock = None  # the connection's socket, once the answer's headers came
        self.thread = threading.Thread(target=self._read, args=(body,),
                                       name="assistd-remote-stream", daemon=True)
        self.thread.start()

    def _put(self, event) -> None:
        while not self.stop.is_set():  # waits while the caller is behind, never past close
            try:
                self.q.put(event, timeout=POLL_S)
                return
            except queue.Full:
                continue

    def _read(self, body: dict) -> None:
        put, t = self._put, self.target
        try:
            with t._http.stream("POST", "/v1/completions", json=body) as r:
                if r.status_code != 200:
                    raw = t._read_capped(r, math.inf, "/v1/completions", t.timeout_s)
                    put(_http_error(t, r.status_code, raw.decode("utf-8", "replace"), r.headers))
                    return
                if r.headers.get("content-encoding", "identity").lower() not in ("identity", ""):
                    raise RemoteTargetError(
                        f"the remote Target {t.url} streamed compressed"
                        f" ({t._shown(r.headers['content-encoding'])!r}) although asked for"
                        " identity", "malformed")
                stream = r.extensions.get("network_stream")
                self.sock = stream.get_extra_info("socket") if stream is not None else None
                put(("open",))
                skipped = 0  # events that were no completion chunk (not JSON, no choices)
                for line in _sse_lines(r.iter_raw(), t):
                    if self.stop.is_set():
                        return
                    if not line.startswith("data:"):
                        continue  # comments (": ping"), event names, blank separators
                    data = line[5:].strip()
                    if data == "[DONE]":
                        put(("done", skipped))
                        return
                    event = _chunk_event(data, t)
                    if event is None:
                        skipped += 1  # not a completion chunk (an unexpected event)
                        continue
                    put(event)
                put(("done", skipped))  # EOF without [DONE]: judged by whether a finish came
        except httpx.HTTPError as e:
            if self.stop.is_set():
                return  # closed by the caller: nobody waits for this
            retry = (isinstance(e, (httpx.ConnectError, httpx.ConnectTimeout))
                     and _tls_failure(e) is None)
            put(("error", retry, None, RemoteTargetError(t._transport_message(e)), False))
        except RemoteTargetError as e:  # a line or stream over its cap, a malformed chunk
            if not self.stop.is_set():
                put(("error", False, None, e, True))
        except Exception as e:  # noqa: BLE001 - reported to the caller, never a traceback
            if not self.stop.is_set():
                put(("error", False, None, RemoteTargetError(
                    t._redact(f"remote Target: {type(e).__name__}: {e}"), "malformed"), False))
        finally:
            self.finished.set()

    def next(self, cancelled, between_rounds, deadline: float | None = None):
        """The next event; None when ``cancelled()`` turned true first, ``("deadline",)``
        when ``deadline`` (``time.monotonic()``) passed first."""
        while True:
            if cancelled is not None and cancelled():
                return None
            wait = POLL_S
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return ("deadline",)
                wait = min(wait, left)
            try:
                return self.q.get(timeout=wait)
            except queue.Empty:
                if between_rounds is not None:
                    between_rounds()

    def close(self) -> None:
        self.stop.set()
        if self.sock is not None and not self.finished.is_set():
            try:
                self.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # closed already


_EOL = re.compile(rb"\r\n|\r|\n")


def _sse_lines(chunks, t: RemoteTarget):
    """The lines of a server-sent event stream (``\\r\\n``, ``\\r`` or ``\\n`` ends one;
    UTF-8, bad bytes replaced) from its raw ``chunks``, never holding more than
    :data:`MAX_LINE_BYTES` of one line nor reading more than :data:`MAX_STREAM_BYTES`:
    past either, :class:`RemoteTargetError` "too_large"."""
    pending, total, skip_lf = bytearray(), 0, False
    for data in chunks:
        total += len(data)
        if total > MAX_STREAM_BYTES:
            raise RemoteTargetError(f"the remote Target {t.url} streamed more than"
                                    f" {MAX_STREAM_BYTES >> 20} MiB; the rest was not read",
                                    "too_large")
        pos = 1 if skip_lf and data[:1] == b"\n" else 0  # a \r\n split between chunks
        skip_lf = False
        for m in _EOL.finditer(data, pos):
            pending += data[pos:m.start()]
            if len(pending) > MAX_LINE_BYTES:
                break
            yield pending.decode("utf-8", "replace")
            pending.clear()
            pos = m.end()
            skip_lf = m.group() == b"\r" and pos == len(data)
        else:
            pending += data[pos:]
        if len(pending) > MAX_LINE_BYTES:
            raise RemoteTargetError(f"the remote Target {t.url} sent an event line over"
                                    f" {MAX_LINE_BYTES >> 20} MiB; the rest was not read",
                                    "too_large")
    if pending:
        yield pending.decode("utf-8", "replace")


_USAGE_KEYS = ("prompt_tokens", "completion_tokens", "total_tokens")


def _chunk_event(data: str, t: RemoteTarget):
    """A ``data:`` event as ``("text", piece, finish, usage)``, or None for one that is
    no completion chunk (not JSON, no ``choices``: skipped and counted); raises
    :class:`RemoteTargetError` "malformed" for a chunk of the wrong shape (a ``text``
    that is no string, ...). ``usage`` keeps the counts that are whole numbers."""
    try:
        chunk = jsonlimits.loads(data, JSON_DEPTH)
    except ValueError:
        return None
    if not isinstance(chunk, dict):
        return None
    usage = chunk.get("usage")
    usage = {k: v for k, v in usage.items() if k in _USAGE_KEYS and isinstance(v, int)
             and not isinstance(v, bool) and 0 <= v < 1 << 31} if isinstance(usage, dict) else {}
    choices = chunk.get("choices")
    if choices is None:
        return ("text", "", None, usage) if usage else None
    if not isinstance(choices, list) or (choices and not isinstance(choices[0], dict)):
        raise RemoteTargetError(f"the remote Target {t.url} sent a malformed chunk:"
                                " its choices are not a list of objects", "malformed")
    choice = choices[0] if choices else {}
    piece, finish = choice.get("text"), choice.get("finish_reason")
    if piece is not None and not isinstance(piece, str):
        raise RemoteTargetError(f"the remote Target {t.url} sent a malformed chunk: its"
                                f" choices[0].text is {type(piece).__name__}, not a string",
                                "malformed")
    if finish is not None and not isinstance(finish, str):
        raise RemoteTargetError(f"the remote Target {t.url} sent a malformed chunk: its"
                                f" finish_reason is {type(finish).__name__}, not a string",
                                "malformed")
    return ("text", encodable(piece or ""), finish, usage)


def _with(exc: Exception, message: str) -> tuple:
    """The arguments that make ``exc``'s class again with ``message``."""
    return (message, exc.kind) if isinstance(exc, RemoteTargetError) else (message,)


def _http_error(t: RemoteTarget, code: int, body: str, headers) -> tuple:
    """The reader's error event for an HTTP status other than 200."""
    message = t._http_message(code, body, headers)
    wait = _retry_after(headers) if code in (429, 503) else None
    if wait is not None and wait > RETRY_AFTER_MAX_S:
        message += f"; it asks to wait {wait:g} s: retry later"
    exc = InputError(message) if code == 400 else RemoteTargetError(message, "http")
    return ("error", code in (429, 503), wait, exc, True)
