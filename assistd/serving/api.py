"""The local API (Starlette): OpenAI-compatible completions and chat, plus assistd's own.

Endpoints:

- ``POST /v1/completions``, ``POST /v1/chat/completions``: OpenAI's request and
  response shapes, ``stream: true`` as server-sent events ending ``data: [DONE]``.
  ``usage`` adds ``assistd``: the generation's ledger (rounds, drafted and accepted
  tokens, acceptance rate, ms), the proposer and draft ceiling, the queue wait.
  An ``assistd`` object in the body (``extra_body`` in the openai package) picks
  ``proposer``, ``k``, the history ``scope`` (a repository path), ``language`` and
  ``priority`` (editor, shell, agent).
  A top-level ``metrics`` object (on a stream: with the last ``usage``) has the
  generation's ``speculative_decoding`` acceptance as vLLM's
  ``--per-request-spec-decode-metrics summary`` gives it (:func:`response_metrics`).
- ``GET /v1/models``, ``GET /v1/assistd/stats``, ``GET /v1/assistd/status``, ``GET /healthz``.
- ``GET /metrics``: Prometheus' text exposition (:mod:`assistd.serving.metrics`): vLLM's
  spec-decode counters since the daemon started, and the suggestion store's outcomes.
- ``POST /v1/assistd/complete`` (``assistd complete``, the MCP tools): the shell front
  end as a client of the daemon. Editors (``assistd lsp``) use the socket beside this
  one (:mod:`assistd.serving.lsp_host`).

Errors are OpenAI-shaped, ``{"error": {"message", "type", "param", "code"}}``, with
a 4xx status for the client's mistakes: malformed JSON, NaN or out-of-range numbers,
nesting deeper than :data:`MAX_JSON_DEPTH`, wrong types, unknown keys (in ``assistd``
objects and on ``/v1/assistd/complete``; OpenAI's bodies ignore keys they do not know,
as OpenAI's own clients send some), oversize values. A 500 is an internal error, whose
details go to the log, not to the client. On a TCP listener every request needs
``Authorization: Bearer <token>``; the Unix socket is protected by its 0600 mode. A
request over TCP whose ``Host`` is not loopback, or one with a non-loopback ``Origin``
on any transport, is refused with a 403 (DNS rebinding, cross-site requests from a web
page in the user's browser).

The wire shapes (request models, checks, response bodies) live in
:mod:`assistd.serving.openai_wire`; this module is the HTTP side: reading a body,
the handlers (parse, check, build a GenerationRequest, run it, shape the answer),
streaming, routes, error handlers and the token.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import math
import time

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from assistd.ground.errors import AssistdError, InputError, ModelError
from assistd.ground.jsonlimits import json_too_deep
from assistd.ground.loopback import LOOPBACK_HOSTS
from assistd.ground.options import parse_k
from assistd.runtime.scheduler import AGENT, EDITOR, PRIORITIES
from assistd.serving.openai_wire import (  # noqa: F401 - re-exported: the API's names
    ApiError,
    AssistdOptions,
    ChatRequest,
    CompleteRequest,
    CompletionRequest,
    Message,
    _Common,
    _validation_message,
    check_chat,
    check_common,
    check_model,
    check_prediction_tokens,
    check_prompt_bytes,
    check_prompt_tokens,
    check_proposer,
    check_token_ids,
    chunk_body,
    completion_body,
    completion_prompt,
    error_body,
    error_type,
    model_body,
    model_list_body,
    parse_request,
    response_id,
    response_metrics,
    sampling_of,
    stop_list,
    usage,
    usage_chunk_body,
)
from assistd.serving.apply_api import apply_endpoint
from assistd.serving.metrics import CONTENT_TYPE, exposition, metrics_registry, read_snapshot
from assistd.serving.service import GenerationRequest, GenerationResult, Service
from proposers.prediction import prediction_usage

log = logging.getLogger("assistd.api")


def _error(status: int, message: str, param=None, code=None, kind="invalid_request_error"):
    return JSONResponse(error_body(message, param, code, kind), status_code=status)


def _sse(body: dict) -> str:
    return f"data: {json.dumps(body)}\n\n"


# Real requests nest a few levels (chat content parts: 5); json's C decoder recurses
# per level, so depth is bounded before it runs.
MAX_JSON_DEPTH = 32


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def _finite(text: str) -> float:
    x = float(text)
    if not math.isfinite(x):  # 1e400: json.loads would give inf
        raise ValueError(f"{text[:40]} is out of range of a 64-bit float")
    return x


async def _read_json(request: Request, limit: int) -> dict:
    """The request's JSON object, at most ``limit`` bytes (max_request_bytes) and
    :data:`MAX_JSON_DEPTH` levels deep. Raises ApiError 413 (too big), 400 (not JSON,
    not an object, too deep, NaN/Infinity)."""
    size = request.headers.get("content-length")
    if size is not None and size.isdigit() and int(size) > limit:
        raise ApiError(413, f"request body of {size} bytes is over the limit of"
                            f" {limit} (max_request_bytes)", code="request_too_large")
    try:
        body = await request.body()
    except ClientDisconnect:  # it hung up (or the daemon closed it) mid-body: no 500 logged
        raise ApiError(400, "the client disconnected before the body ended") from None
    if len(body) > limit:
        raise ApiError(413, f"request body over {limit} bytes", code="request_too_large")
    if json_too_deep(body, MAX_JSON_DEPTH):
        raise ApiError(400, f"request body nests more than {MAX_JSON_DEPTH} levels deep",
                       code="invalid_json")
    try:
        data = json.loads(body, parse_constant=_no_constant, parse_float=_finite)
    except (ValueError, RecursionError) as e:  # JSONDecodeError, UnicodeDecodeError
        raise ApiError(400, f"request body is not valid JSON: {e}",
                       code="invalid_json") from None
    if not isinstance(data, dict):
        raise ApiError(400, "request body must be a JSON object", code="invalid_json")
    return data


def _known_proposers() -> list[str]:
    from assistd.runtime.runtime import served_proposers

    return served_proposers()


def _priority_of(req: _Common) -> int:
    a = req.assistd
    return PRIORITIES[a.priority] if a is not None and a.priority else AGENT


async def _usage(gen: GenerationRequest, r: GenerationResult) -> dict:
    # The prediction's counts in a worker thread, not the engine's: a diff of two token
    # lists, ~0.2 s for 4,000 tokens of code, seconds for a hostile repetitive pair.
    prediction = (None if gen.prediction is None else
                  await run_in_threadpool(prediction_usage, gen.prediction, r.tokens))
    return usage(len(gen.prompt), len(r.tokens), ledger=r.ledger, proposer=r.proposer,
                 k=r.k, stop_reason=r.stop_reason, queue_ms=r.queue_ms,
                 prediction=prediction)


def _metrics(r: GenerationResult) -> dict:
    return response_metrics(r.ledger, proposer=r.proposer, k=r.k)


# -- running a generation ---------------------------------------------------------------


async def _wait(request: Request, gen: GenerationRequest, future) -> GenerationResult:
    """The result of ``future`` (a non-streamed generation). A client that hangs up (an
    agent's own timeout or cancel) stops the generation within one round instead of
    holding the Target."""
    fut = asyncio.wrap_future(future)
    try:
        while not fut.done():
            await asyncio.wait({fut}, timeout=0.25)
            if not fut.done() and await request.is_disconnected():
                gen.cancel.set()
        return await fut
    except asyncio.CancelledError:
        gen.cancel.set()
        raise


def _start_streaming(service: Service, gen: GenerationRequest, priority: int) -> asyncio.Queue:
    """Start ``gen``: its pieces of text arrive on the queue as ``("text", str)``, then
    ``("done", its future)``."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()

    def post(item) -> None:
        try:
            loop.call_soon_threadsafe(queue.put_nowait, item)
        except RuntimeError:  # the loop is closed: the client and server are gone
            gen.cancel.set()

    gen.on_text = lambda text: post(("text", text))
    fut = service.generate(gen, priority)
    fut.add_done_callback(lambda f: post(("done", f)))
    return queue


async def _events(queue: asyncio.Queue, gen: GenerationRequest, head: tuple, *,
                  chat: bool, include_usage: bool):
    """The server-sent events of a stream: chunks, the last with ``usage`` (or an
    error), then ``data: [DONE]``. ``head``: (id, created, model)."""
    try:
        if chat:
            yield _sse(chunk_body(*head, chat=True, first=True))
        while True:
            kind, value = await queue.get()
            if kind == "text":
                yield _sse(chunk_body(*head, chat=chat, text=value))
                continue
            try:
                r = value.result()
            except Exception as e:  # noqa: BLE001 - reported in the stream
                status, message = _status_of(e)
                yield _sse(error_body(message, kind=error_type(status)))
                break
            u, m = await _usage(gen, r), _metrics(r)
            yield _sse(chunk_body(*head, chat=chat, finish_reason=r.finish_reason, usage=u,
                                  metrics=m))
            if include_usage:
                yield _sse(usage_chunk_body(*head, u, chat=chat, metrics=m))
            break
        yield "data: [DONE]\n\n"
    finally:
        gen.cancel.set()  # a client gone mid-stream stops the generation


async def _respond(service: Service, request: Request, req: _Common,
                   gen: GenerationRequest, *, chat: bool):
    """Run ``gen`` and answer: one JSON body, or a stream when ``req.stream``."""
    head = (response_id(chat), int(time.time()), service.model_id)
    if not req.stream:
        r = await _wait(request, gen, service.generate(gen, _priority_of(req)))
        u = await _usage(gen, r)
        return JSONResponse(completion_body(*head, r.text, r.finish_reason, u, chat=chat,
                                            metrics=_metrics(r)))
    queue = _start_streaming(service, gen, _priority_of(req))
    include_usage = bool((req.stream_options or {}).get("include_usage"))
    return StreamingResponse(_events(queue, gen, head, chat=chat, include_usage=include_usage),
                             media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache"})


# -- the application ------------------------------------------------------------------


def build_app(service: Service, token: str | None = None) -> Starlette:
    """The ASGI app over ``service``. ``token``: the bearer token TCP requests need."""
    config = service.config
    max_piece = max((len(b) for b in service.target.pieces()), default=1) or 1

    # "remote": the id a remote Target was listed under before it listed the server's own
    aliases = ("assistd", "remote") if getattr(service.target, "remote", False) else ("assistd",)

    def checked(req: _Common, max_tokens: int | None) -> None:
        check_common(req, max_tokens, model_id=service.model_id,
                     max_tokens_limit=config.max_tokens_limit, aliases=aliases)

    def fits(text: str) -> None:
        check_prompt_bytes(text, n_ctx=service.target.n_ctx, max_piece=max_piece)

    async def prediction_ids(req: _Common) -> list[int] | None:
        """The request's prediction in the Target's token space (no BOS: it is output)."""
        if req.prediction is None:
            return None
        text = _valid(req.prediction.text)
        check_prompt_bytes(text, n_ctx=service.target.n_ctx, max_piece=max_piece,
                           param="prediction")
        ids = await run_in_threadpool(service.target.tokenize, text) if text else []
        check_prediction_tokens(len(ids), n_ctx=service.target.n_ctx)
        return ids

    def gen_request(req: _Common, prompt: list[int], max_tokens: int,
                    prediction: list[int] | None = None) -> GenerationRequest:
        n_ctx = service.target.n_ctx
        check_prompt_tokens(len(prompt), n_ctx=n_ctx)
        a = req.assistd or AssistdOptions()
        if a.proposer is not None:
            check_proposer(a.proposer, _known_proposers())
        return GenerationRequest(
            prompt=prompt, max_tokens=max_tokens,  # the context's end stops it: "n_ctx"
            sampling=sampling_of(req), stop=tuple(s for s in stop_list(req.stop) if s),
            proposer=a.proposer, k=a.k, scope=a.scope, language=a.language or "plaintext",
            prediction=prediction)

    async def prompt_ids(prompt: str | list[int]) -> list[int]:
        t = service.target
        if not isinstance(prompt, str):
            if getattr(t, "remote", False) and not t.local_tokenizer:
                # ids are the server's, its vocabulary size unknown here: unchecked, an id
                # past it can crash the server (llama-cpp-python's detokenize does)
                raise ApiError(400, "a prompt of token ids needs the server model's tokenizer"
                                    " here: start assistd serve with --model (that model's GGUF or"
                                    " Hugging Face folder),"
                                    " or send the prompt as text", param="prompt")
            check_token_ids(prompt, n_vocab=t.n_vocab)
            return list(prompt)
        text = _valid(prompt)
        fits(text)
        ids = await run_in_threadpool(t.tokenize, text)
        if (t.add_bos or not ids) and t.bos_token_id is not None:
            ids = [t.bos_token_id] + ids
        return ids

    # -- handlers ---------------------------------------------------------------------

    async def completions(request: Request):
        req = parse_request(CompletionRequest, await _read_json(request, config.max_request_bytes))
        checked(req, req.max_tokens)
        ids = await prompt_ids(completion_prompt(req))
        gen = gen_request(req, ids, req.max_tokens or 16, await prediction_ids(req))
        return await _respond(service, request, req, gen, chat=False)

    async def chat_completions(request: Request):
        from assistd.runtime.chat import chat_prompt_ids, message_text

        req = parse_request(ChatRequest, await _read_json(request, config.max_request_bytes))
        max_tokens = req.max_completion_tokens or req.max_tokens
        checked(req, max_tokens)
        check_chat(req)
        messages = [{"role": m.role, "content": _valid(message_text(m.content))}
                    for m in req.messages]
        fits("".join(m["content"] for m in messages))
        ids = await run_in_threadpool(chat_prompt_ids, service.target, messages)
        default = min(config.max_tokens_limit, service.target.n_ctx)
        gen = gen_request(req, ids, max_tokens or default, await prediction_ids(req))
        return await _respond(service, request, req, gen, chat=True)

    async def models(request: Request):
        return JSONResponse(model_list_body(service.model_id, int(service.started_at),
                                            n_ctx=service.target.n_ctx,
                                            backend=service.target.backend))

    async def model(request: Request):
        check_model(request.path_params["model"], model_id=service.model_id, aliases=aliases)
        return JSONResponse(model_body(service.model_id, int(service.started_at)))

    async def healthz(request: Request):
        return JSONResponse({"status": "ok", "model": service.model_id})

    async def stats(request: Request):
        scope = request.query_params.get("scope")
        if scope is not None and (len(scope) > 4096 or "\0" in scope):
            raise ApiError(400, "scope must be a path (at most 4096 characters)", param="scope")
        out = await asyncio.wrap_future(service.submit(lambda: service.stats_job(scope),
                                                       EDITOR, "stats"))
        return JSONResponse({**out, "daemon": service.status()})

    async def status(request: Request):
        return JSONResponse(service.status())

    # Read on the engine thread at each scrape (the counters and the store are its), as stats is.
    registry = metrics_registry(lambda: service.submit(
        lambda: read_snapshot(service.runtime), EDITOR, "metrics").result())

    async def metrics(request: Request):
        return Response(await run_in_threadpool(exposition, registry), media_type=CONTENT_TYPE)

    async def complete(request: Request):
        req = parse_request(CompleteRequest,
                            await _read_json(request, config.max_request_bytes))
        if req.max_tokens > config.max_tokens_limit:
            raise ApiError(400, f"max_tokens must be 1..{config.max_tokens_limit}"
                                " (max_tokens_limit)", param="max_tokens")
        try:
            parse_k(req.k)
        except InputError as e:
            raise ApiError(400, str(e), param="k") from None
        args = req.model_dump(exclude_none=True)
        args["sampling"] = req.sampling.model_dump() if req.sampling else {}
        return JSONResponse(await asyncio.wrap_future(service.complete_at(args)))

    routes = [
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/models/{model:path}", model, methods=["GET"]),
        Route("/v1/assistd/stats", stats, methods=["GET"]),
        Route("/v1/assistd/status", status, methods=["GET"]),
        Route("/v1/assistd/complete", complete, methods=["POST"]),
        Route("/v1/assistd/apply", apply_endpoint(service, _read_json), methods=["POST"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
    ]
    app = Starlette(routes=routes, exception_handlers={
        ApiError: _on_api_error, AssistdError: _on_error, ValueError: _on_error,
        HTTPException: _on_http, Exception: _on_error})
    app.add_middleware(_TokenAuth, token=token)
    tcp = config.tcp_address()
    app.add_middleware(_LoopbackOnly, extra_hosts=(tcp[0],) if tcp and config.allow_remote
                       else ())  # outermost: refused before the token is even looked at
    return app


# -- errors and the token --------------------------------------------------------------


async def _on_api_error(request, exc: ApiError):
    return _error(exc.status, exc.message, exc.param, exc.code, exc.kind)


async def _on_error(request, exc: Exception):
    status, message = _status_of(exc)
    if status >= 500:
        log.error("%s %s failed: %s", request.method, request.url.path, message,
                  exc_info=exc if not isinstance(exc, AssistdError) else None)
    return _error(status, message, kind=error_type(status))


async def _on_http(request, exc):
    return _error(exc.status_code, str(exc.detail), code="not_found"
                  if exc.status_code == 404 else None)


def _valid(text: str) -> str:
    """Lone surrogates (JSON allows ``\\ud800``) become U+FFFD: the tokenizer takes UTF-8."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def _status_of(exc: BaseException) -> tuple[int, str]:
    if isinstance(exc, ApiError):
        return exc.status, exc.message
    if isinstance(exc, InputError):
        return 400, str(exc)
    if isinstance(exc, ModelError):  # a remote Target's says which: 502 for a bad answer,
        return getattr(exc, "http_status", 503), str(exc)  # 504 past its deadline
    if isinstance(exc, AssistdError):
        return 500, str(exc)
    if isinstance(exc, ValueError):
        return 400, str(exc)
    if isinstance(exc, RuntimeError) and "shutting down" in str(exc):
        return 503, "the daemon is shutting down; retry when it is back"
    return 500, "internal error; the daemon's log has the details"


def _over_unix(scope) -> bool:
    """uvicorn gives a Unix-socket connection the server address ``(path, None)``."""
    server = scope.get("server")
    return isinstance(server, (tuple, list)) and len(server) == 2 and server[1] is None


def host_name(value: str) -> str:
    """The host of a ``Host`` header or an origin's authority, lower case, without the
    port or IPv6 brackets: ``"[::1]:8765"`` -> ``"::1"``."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1:value.find("]")] if "]" in value else value
    name, sep, port = value.rpartition(":")
    return name if sep and port.isdigit() else value


def origin_host(origin: str) -> str | None:
    """The host of an ``Origin`` header (``"null"``, opaque or malformed: None)."""
    scheme, sep, rest = origin.strip().partition("://")
    if not sep or scheme.lower() not in ("http", "https") or not rest:
        return None
    return host_name(rest.split("/", 1)[0].rpartition("@")[2])


class _LoopbackOnly:
    """Pure ASGI middleware against DNS rebinding and cross-site requests: a web page
    in the user's browser can reach a loopback port, under a foreign ``Host`` (a
    rebound name) or with its own ``Origin``. Over TCP the ``Host`` must be a loopback
    name (any port) or one of ``extra_hosts`` (the address of an allow_remote
    listener); on every transport an ``Origin``, when sent, must be loopback too.
    Refused with a 403 naming the header. A Unix socket's ``Host`` is whatever its
    client wrote (httpx: the URL's), and no browser reaches it."""

    def __init__(self, app, extra_hosts=()):
        self.app = app
        self.hosts = LOOPBACK_HOSTS | {host_name(h) for h in extra_hosts}

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            headers = dict(scope.get("headers") or [])
            host = headers.get(b"host", b"").decode("latin-1")
            origin = headers.get(b"origin")
            refusal = None
            if not _over_unix(scope) and host_name(host) not in self.hosts:
                refusal = ("forbidden_host", f"Host {host[:100]!r} is not this machine's"
                           " loopback address; the API answers only 127.0.0.1, localhost"
                           " or [::1] (a foreign Host is how a web page reaches a local"
                           " port: DNS rebinding)")
            elif origin is not None and origin_host(origin.decode("latin-1")) not in self.hosts:
                refusal = ("forbidden_origin", f"Origin {origin.decode('latin-1')[:100]!r}"
                           " is not loopback; requests from web pages are refused")
            if refusal is not None:
                code, message = refusal
                await _error(403, message, code=code, kind="permission_error")(
                    scope, receive, send)
                return
        await self.app(scope, receive, send)


class _TokenAuth:
    """Pure ASGI middleware: a request over TCP needs ``Authorization: Bearer <token>``
    (a Unix socket is protected by its 0600 mode)."""

    def __init__(self, app, token: str | None):
        self.app, self.token = app, token

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and not _over_unix(scope):
            header = dict(scope.get("headers") or []).get(b"authorization", b"")
            expected = f"Bearer {self.token}".encode() if self.token else None
            if expected is None or not hmac.compare_digest(header, expected):
                response = _error(401, "missing or wrong bearer token; TCP requests need"
                                       " 'Authorization: Bearer <the token in the token"
                                       " file>' (see assistd serve --print-config)",
                                  code="invalid_api_key", kind="authentication_error")
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
