"""The remote Target's connection to its server: the URL checked (:func:`base_url`), TLS,
the key as a bearer header, and every non-streamed request read to a cap
(:class:`Server`); the messages that name what went wrong and what to check.

Network rules: the key goes only to the configured URL (redirects are never followed);
``http://`` to a host other than this machine (loopback, or the unspecified 0.0.0.0)
warns once; the proxy and CA variables are honoured (httpx ``trust_env``;
``REQUESTS_CA_BUNDLE`` too), and a CA bundle may be given. Answers are asked for
uncompressed, so that each body is capped as sent (no gzip bomb)."""

from __future__ import annotations

import ipaddress
import logging
import os
import ssl
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from assistd.ground import jsonlimits
from assistd.ground.errors import InputError
from assistd.targets.remote.auth import KEY_ENV, KeyFile
from assistd.targets.remote.errors import (ERROR_CHARS, JSON_DEPTH, RemoteTargetError,
                                           error_detail, printable, redact_key)

log = logging.getLogger("assistd.targets.remote")  # one logger for the whole remote Target
# httpcore's debug traces print each answer's headers, where a hostile server may echo
# the key (a Retry-After, any header): they never reach assistd's log.
logging.getLogger("httpcore").setLevel(logging.INFO)

CONNECT_TIMEOUT_S = 5.0
MAX_BODY_BYTES = 2 << 20  # one answer's JSON (/v1/models, tokenize: ~1 MB per 128k ids)
MAX_ERROR_BYTES = 64 << 10  # an error's body; the rest is not read
MAX_URL_CHARS = 2048  # --target-url


def is_this_machine(host: str) -> bool:
    """``localhost``, a loopback address (127.0.0.0/8, ::1), or the unspecified address
    (0.0.0.0, ::): a bind address, which a client connecting to it reaches on this
    machine (Linux and macOS connect it to loopback), so nothing crosses the network.

    >>> is_this_machine("127.0.0.2"), is_this_machine("0.0.0.0"), is_this_machine("10.0.0.1")
    (True, True, False)
    """
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
    :data:`MAX_URL_CHARS` characters.

    >>> base_url("http://127.0.0.1:8080/v1/")
    'http://127.0.0.1:8080'
    """
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


def warn_if_plain(url: str) -> None:
    """Warn once per host when ``url`` is plain ``http://`` to another machine."""
    host = urlsplit(url).hostname or ""
    plain = url.startswith("http://") and not is_this_machine(host)
    if plain and host not in _warned_plain:
        _warned_plain.add(host)
        log.warning("warning: the remote Target %s is plain http:// on another host: prompts"
                    " (and the key) cross the network unencrypted; use https://", url)


def ssl_context(ca_bundle: Path | str | None, environ=None) -> ssl.SSLContext | bool:
    """What httpx verifies TLS with: ``ca_bundle``, else ``$REQUESTS_CA_BUNDLE`` (httpx
    itself reads ``$SSL_CERT_FILE``/``$SSL_CERT_DIR``), else httpx's default. Raises
    :class:`InputError` for a bundle that cannot be read."""
    environ = os.environ if environ is None else environ
    path = ca_bundle or (None if environ.get("SSL_CERT_FILE")
                         else environ.get("REQUESTS_CA_BUNDLE"))
    if not path:
        return True
    try:
        return ssl.create_default_context(cafile=str(Path(path).expanduser()))
    except (OSError, ssl.SSLError) as e:
        raise InputError(f"CA bundle {path}: {e}") from None


@dataclass
class Answer:
    """A non-streamed answer, read to its cap (:meth:`Server.fetch`)."""

    status_code: int
    content: bytes
    headers: httpx.Headers

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")

    def json(self):
        """The body as JSON; ValueError when it is none."""
        return jsonlimits.loads(self.content, JSON_DEPTH)


class Server:
    """One OpenAI-compatible server at ``url`` (checked by :func:`base_url` already):
    an httpx client that follows no redirect, sends the key (``key``, or ``key_file``
    read again when it changes) and verifies TLS with ``verify``
    (:func:`ssl_context`). ``timeout_s``: the read timeout, seconds (connecting gets at
    most :data:`CONNECT_TIMEOUT_S`)."""

    def __init__(self, url: str, *, key: str | None, key_file: Path | str | None,
                 timeout_s: float, verify: ssl.SSLContext | bool):
        self.url, self.timeout_s = url, float(timeout_s)
        warn_if_plain(url)
        auth = KeyFile(key_file, key) if key_file else None
        self._auth, self._static_key = auth, None if auth else key
        headers = {"Authorization": f"Bearer {key}"} if key and not auth else {}
        headers["Accept-Encoding"] = "identity"  # bodies are capped as sent (no gzip bomb)
        self.keyed = bool(key or auth)
        self.http = httpx.Client(
            base_url=url, headers=headers, auth=auth, follow_redirects=False, trust_env=True,
            verify=verify,
            timeout=httpx.Timeout(self.timeout_s, connect=self.connect_timeout_s))

    @property
    def connect_timeout_s(self) -> float:
        return min(CONNECT_TIMEOUT_S, self.timeout_s)

    # -- what the server said, fit to show ---------------------------------------

    def redact(self, text: str) -> str:
        """``text`` without the key, nor any piece of it of ``KEY_PIECE`` characters or
        more: a server may quote the request back (whole, or cut) in its error, a header
        or a model id. Call it before anything cuts the text."""
        return redact_key(text, self._auth.key if self._auth is not None else self._static_key)

    def shown(self, text) -> str | None:
        """Text that came from the server, fit to be shown (status, the log, a message):
        the key replaced, control characters escaped, at most ``ERROR_CHARS`` characters."""
        return None if text is None else printable(self.redact(str(text)))[:ERROR_CHARS]

    # -- capped requests -------------------------------------------------------

    def fetch(self, method: str, path: str, timeout: float | None = None, **kw) -> Answer:
        """One request whose answer is read to its cap: :data:`MAX_BODY_BYTES` for a 200
        (more raises :class:`RemoteTargetError` "too_large"), :data:`MAX_ERROR_BYTES` of
        an error (the rest is not read), all within ``timeout`` seconds (default
        ``timeout_s``; past it: "deadline"). Raises ``httpx.HTTPError`` as httpx does."""
        limit = self.timeout_s if timeout is None else timeout
        end = time.monotonic() + limit
        with self.http.stream(method, path, timeout=httpx.Timeout(
                limit, connect=min(CONNECT_TIMEOUT_S, limit)), **kw) as r:
            body = self.read_capped(r, end, path, limit)
        return Answer(r.status_code, body, r.headers)

    def read_capped(self, r: httpx.Response, end: float, what: str, limit: float) -> bytes:
        """The body of ``r`` (an answer to ``what``) read to its cap before ``end``
        (``time.monotonic()``; ``limit``: the seconds that stands for, for the message)."""
        ok = r.status_code == 200
        cap = MAX_BODY_BYTES if ok else MAX_ERROR_BYTES
        if not identity(r):
            if not ok:
                return b""  # an error's detail we did not ask to decompress: left out
            raise self.compressed(r, what)
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

    def compressed(self, r: httpx.Response, what: str) -> RemoteTargetError:
        return RemoteTargetError(
            f"the remote Target {self.url} answered {what} compressed"
            f" ({self.shown(r.headers['content-encoding'])!r}) although asked for identity",
            "malformed")

    # -- messages ------------------------------------------------------------------

    def transport_message(self, e: Exception) -> str:
        """What a transport error (``httpx.HTTPError``) means and what to check."""
        if isinstance(e, httpx.ConnectTimeout):
            return (f"the remote Target {self.url} did not accept a connection within"
                    f" {self.connect_timeout_s:g} s; check the URL and the network")
        tls = tls_failure(e) if isinstance(e, httpx.ConnectError) else None
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

    def http_message(self, code: int, body: str, headers) -> str:
        """What an HTTP status other than 200 means, with the server's own detail."""
        detail = error_detail(body, self.redact)
        if 300 <= code < 400:
            return (f"the remote Target {self.url} answered with a redirect (HTTP {code});"
                    " assistd does not follow redirects, so that the key goes only to the"
                    " configured URL: set --target-url to the server's own address")
        if code in (401, 403) and not self.keyed:
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
            wait = retry_after(headers)  # a number, or not said (it is the server's text)
            return (f"the remote Target {self.url} is rate limiting (HTTP 429"
                    + (f", Retry-After {wait:g} s" if wait is not None else "") + ")")
        return f"the remote Target {self.url} failed (HTTP {code}{detail})"

    def close(self) -> None:
        self.http.close()


def identity(r: httpx.Response) -> bool:
    """Whether ``r`` came uncompressed, as asked."""
    return r.headers.get("content-encoding", "identity").lower() in ("identity", "")


def tls_failure(e: BaseException) -> ssl.SSLError | None:
    """The TLS error behind ``e`` (httpx keeps it as the cause or context; its
    ``reason`` is e.g. ``"WRONG_VERSION_NUMBER"``), or None when there is none."""
    seen = 0
    while e is not None and seen < 8:
        if isinstance(e, ssl.SSLError):
            return e
        e, seen = e.__cause__ or e.__context__, seen + 1
    return None


def retry_after(headers) -> float | None:
    """A ``Retry-After`` of seconds (0 up to a day), else None (a date, or junk).

    >>> retry_after({"retry-after": "2.5"}), retry_after({"retry-after": "Wed, 21 Oct"})
    (2.5, None)
    """
    try:
        wait = float(headers.get("retry-after") or "")
    except ValueError:
        return None
    return wait if 0 <= wait <= 86400 else None
