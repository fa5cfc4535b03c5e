"""The local API (Starlette): OpenAI-compatible completions and chat, plus assistd's own.

Endpoints:

- ``POST /v1/completions``, ``POST /v1/chat/completions``: OpenAI's request and
  response shapes, ``stream: true`` as server-sent events ending ``data: [DONE]``.
  ``usage`` adds ``assistd``: the generation's ledger (rounds, drafted and accepted
  tokens, acceptance rate, ms), the proposer and draft ceiling, the queue wait.
  An ``assistd`` object in the body (``extra_body`` in the openai package) picks
  ``proposer``, ``k``, the history ``scope`` (a repository path), ``language`` and
  ``priority`` (editor, shell, agent).
- ``GET /v1/models``, ``GET /v1/assistd/stats``, ``GET /v1/assistd/status``, ``GET /healthz``.
- ``POST /v1/assistd/complete`` (``assistd complete``) and ``POST /v1/assistd/lsp``
  (``assistd lsp``): the CLI front ends as clients of the daemon.

Errors are OpenAI-shaped, ``{"error": {"message", "type", "param", "code"}}``, with
a 4xx status for the client's mistakes. On a TCP listener every request needs
``Authorization: Bearer <token>``; the Unix socket is protected by its 0600 mode.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import threading
import time
import uuid
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from assistd.ground.errors import AssistdError, InputError, ModelError
from assistd.ground.options import parse_k
from assistd.ground.sampling import SamplingParams
from assistd.serving.scheduler import AGENT, EDITOR, PRIORITIES, SHELL
from assistd.serving.service import GenerationRequest, GenerationResult, Service

log = logging.getLogger("assistd.api")


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None,
                 code: str | None = None, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = (
            status, message, param, code, kind)


def _error(status: int, message: str, param=None, code=None, kind="invalid_request_error"):
    return JSONResponse({"error": {"message": message, "type": kind, "param": param,
                                   "code": code}}, status_code=status)


# -- request models ----------------------------------------------------------------


class AssistdOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    proposer: str | None = None
    k: int | Literal["auto"] | None = Field(None)
    scope: str | None = None
    language: str | None = Field(None, pattern=r"^[A-Za-z0-9_.+#-]{1,64}$")
    priority: Literal["editor", "shell", "agent"] | None = None


class _Common(BaseModel):
    # strict: "5" is not a number of tokens, "yes" is not a boolean (as OpenAI answers)
    model_config = ConfigDict(extra="ignore", strict=True)
    model: str
    max_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0, le=2)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(0, ge=0)
    repetition_penalty: float = Field(1.0, gt=0)
    seed: int | None = Field(None, ge=0)
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: dict | None = None
    n: int = Field(1, ge=1)
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    logprobs: bool | int | None = None
    response_format: dict | None = None
    assistd: AssistdOptions | None = None


class CompletionRequest(_Common):
    max_tokens: int | None = Field(16, ge=1)  # OpenAI's default for /v1/completions
    prompt: str | list[str] | list[int]
    echo: bool = False
    suffix: str | None = None


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[dict] | None  # required; null only makes sense with tool calls


class ChatRequest(_Common):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    tools: list | None = None


def _validation_message(e: ValidationError) -> tuple[str, str | None]:
    err = e.errors()[0]
    loc = ".".join(str(x) for x in err["loc"])
    return f"{loc}: {err['msg']}" if loc else err["msg"], (loc or None)


# -- the application ------------------------------------------------------------------


def build_app(service: Service, token: str | None = None) -> Starlette:
    """The ASGI app over ``service``. ``token``: the bearer token TCP requests need."""
    config = service.config
    lsp_inflight: dict[str, threading.Event] = {}

    async def read_json(request: Request) -> dict:
        size = request.headers.get("content-length")
        if size is not None and size.isdigit() and int(size) > config.max_request_bytes:
            raise ApiError(413, f"request body of {size} bytes is over the limit of"
                                f" {config.max_request_bytes} (max_request_bytes)",
                           code="request_too_large")
        body = await request.body()
        if len(body) > config.max_request_bytes:
            raise ApiError(413, f"request body over {config.max_request_bytes} bytes",
                           code="request_too_large")
        try:
            data = json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ApiError(400, f"request body is not valid JSON: {e}",
                           code="invalid_json") from None
        if not isinstance(data, dict):
            raise ApiError(400, "request body must be a JSON object", code="invalid_json")
        return data

    def parse(model, data):
        try:
            return model.model_validate(data)
        except ValidationError as e:
            msg, param = _validation_message(e)
            raise ApiError(400, msg, param=param) from None

    def check_common(req: _Common, max_tokens: int | None) -> None:
        if req.model not in (service.model_id, "assistd"):
            raise ApiError(404, f"the model {req.model!r} does not exist; this daemon serves"
                                f" {service.model_id!r} (see GET /v1/models)",
                           param="model", code="model_not_found")
        if req.n != 1:
            raise ApiError(400, "n > 1 is not supported; send separate requests", param="n")
        if req.logprobs:
            raise ApiError(400, "logprobs are not supported", param="logprobs")
        if req.response_format and req.response_format.get("type", "text") != "text":
            raise ApiError(400, "response_format other than text (JSON mode, schemas) is not"
                                " supported", param="response_format")
        if req.frequency_penalty or req.presence_penalty:
            raise ApiError(400, "frequency_penalty and presence_penalty are not supported;"
                                " use repetition_penalty", param="frequency_penalty")
        if max_tokens is not None and max_tokens > config.max_tokens_limit:
            raise ApiError(400, f"max_tokens {max_tokens} is over this daemon's limit of"
                                f" {config.max_tokens_limit} (max_tokens_limit)",
                           param="max_tokens")
        stops = [req.stop] if isinstance(req.stop, str) else (req.stop or [])
        if len(stops) > 4:
            raise ApiError(400, "at most 4 stop sequences", param="stop")
        a = req.assistd
        if a is not None and a.k is not None:
            try:
                parse_k(a.k, what="assistd.k")
            except InputError as e:
                raise ApiError(400, str(e), param="assistd.k") from None

    max_piece = max((len(b) for b in service.target.pieces()), default=1) or 1

    def too_long(text: str) -> None:
        """Refuse a prompt that cannot fit before tokenizing megabytes of it: a token is
        at most ``max_piece`` bytes, so more bytes than that times n_ctx never fit."""
        n_ctx = service.target.n_ctx
        size = len(text.encode("utf-8", "replace"))
        if size > n_ctx * max_piece:
            raise ApiError(400, f"the prompt is {size} bytes, more than this model's context"
                                f" window of {n_ctx} tokens can hold", param="prompt",
                           code="context_length_exceeded")

    def sampling_of(req: _Common) -> SamplingParams:
        try:
            return SamplingParams(temperature=req.temperature, top_k=req.top_k, top_p=req.top_p,
                                  repetition_penalty=req.repetition_penalty, seed=req.seed)
        except ValueError as e:
            raise ApiError(400, str(e)) from None

    def gen_request(req: _Common, prompt: list[int], max_tokens: int) -> GenerationRequest:
        if not prompt:
            raise ApiError(400, "the prompt is empty", param="prompt")
        n_ctx = service.target.n_ctx
        if len(prompt) + 1 >= n_ctx:
            raise ApiError(400, f"the prompt is {len(prompt)} tokens; this model's context"
                                f" window is {n_ctx} tokens", param="prompt",
                           code="context_length_exceeded")
        a = req.assistd or AssistdOptions()
        if a.proposer is not None:
            from proposers import available

            known = ["none"] + [p for p in available() if p != "draft_model"]
            if a.proposer not in known:
                raise ApiError(400, f"unknown proposer {a.proposer!r}; known here:"
                                    f" {', '.join(known)}", param="assistd.proposer")
        stops = [req.stop] if isinstance(req.stop, str) else (req.stop or [])
        return GenerationRequest(
            prompt=prompt, max_tokens=min(max_tokens, n_ctx - len(prompt) - 1),
            sampling=sampling_of(req), stop=tuple(s for s in stops if s),
            proposer=a.proposer, k=a.k, scope=a.scope, language=a.language or "plaintext")

    def priority_of(req: _Common) -> int:
        a = req.assistd
        return PRIORITIES[a.priority] if a is not None and a.priority else AGENT

    def usage(prompt_tokens: int, r: GenerationResult) -> dict:
        return {"prompt_tokens": prompt_tokens, "completion_tokens": len(r.tokens),
                "total_tokens": prompt_tokens + len(r.tokens),
                "assistd": {"ledger": r.ledger, "proposer": r.proposer, "k": r.k,
                            "stop_reason": r.stop_reason, "queue_ms": r.queue_ms}}

    async def run_generation(request: Request, req: _Common, gen: GenerationRequest,
                             chat: bool):
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        created = int(time.time())
        obj = "chat.completion" if chat else "text_completion"
        if not req.stream:
            fut = asyncio.wrap_future(service.generate(gen, priority_of(req)))
            try:
                # A client that hangs up (an agent's own timeout or cancel) stops the
                # generation within one round instead of holding the Target.
                while not fut.done():
                    await asyncio.wait({fut}, timeout=0.25)
                    if not fut.done() and await request.is_disconnected():
                        gen.cancel.set()
                r: GenerationResult = await fut
            except asyncio.CancelledError:
                gen.cancel.set()
                raise
            choice = ({"index": 0, "message": {"role": "assistant", "content": r.text},
                       "finish_reason": r.finish_reason, "logprobs": None} if chat else
                      {"index": 0, "text": r.text, "finish_reason": r.finish_reason,
                       "logprobs": None})
            return JSONResponse({"id": rid, "object": obj, "created": created,
                                 "model": service.model_id, "choices": [choice],
                                 "usage": usage(len(gen.prompt), r)})

        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        def post(item) -> None:
            try:
                loop.call_soon_threadsafe(queue.put_nowait, item)
            except RuntimeError:  # the loop is closed: the client and server are gone
                gen.cancel.set()

        gen.on_text = lambda text: post(("text", text))
        fut = service.generate(gen, priority_of(req))
        fut.add_done_callback(lambda f: post(("done", f)))
        chunk_obj = "chat.completion.chunk" if chat else "text_completion"
        include_usage = bool((req.stream_options or {}).get("include_usage"))

        def chunk(delta_text: str | None, finish: str | None, first: bool = False,
                  extra: dict | None = None) -> str:
            if chat:
                delta = {"role": "assistant", "content": ""} if first else (
                    {"content": delta_text} if delta_text is not None else {})
                choice = {"index": 0, "delta": delta, "finish_reason": finish,
                          "logprobs": None}
            else:
                choice = {"index": 0, "text": delta_text or "", "finish_reason": finish,
                          "logprobs": None}
            body = {"id": rid, "object": chunk_obj, "created": created,
                    "model": service.model_id, "choices": [choice], **(extra or {})}
            return f"data: {json.dumps(body)}\n\n"

        async def events():
            try:
                if chat:
                    yield chunk(None, None, first=True)
                while True:
                    kind, value = await queue.get()
                    if kind == "text":
                        yield chunk(value, None)
                        continue
                    try:
                        r = value.result()
                    except Exception as e:  # noqa: BLE001 - reported in the stream
                        status, message = _status_of(e)
                        yield "data: " + json.dumps({"error": {
                            "message": message, "type": "server_error" if status >= 500
                            else "invalid_request_error", "param": None, "code": None}}) + "\n\n"
                        break
                    u = usage(len(gen.prompt), r)
                    yield chunk(None, r.finish_reason, extra={"usage": u})
                    if include_usage:
                        body = {"id": rid, "object": chunk_obj, "created": created,
                                "model": service.model_id, "choices": [], "usage": u}
                        yield f"data: {json.dumps(body)}\n\n"
                    break
                yield "data: [DONE]\n\n"
            finally:
                gen.cancel.set()  # a client gone mid-stream stops the generation

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})

    # -- handlers ---------------------------------------------------------------------

    async def completions(request: Request):
        data = await read_json(request)
        req = parse(CompletionRequest, data)
        check_common(req, req.max_tokens)
        if req.echo:
            raise ApiError(400, "echo is not supported", param="echo")
        if req.suffix:
            raise ApiError(400, "suffix (fill-in-the-middle) is not supported here; use"
                                " assistd lsp for FIM", param="suffix")
        p = req.prompt
        if isinstance(p, list) and p and isinstance(p[0], str):
            if len(p) != 1:
                raise ApiError(400, "a batch of prompts is not supported; send one per request",
                               param="prompt")
            p = p[0]
        t = service.target
        if isinstance(p, str):
            p = _valid(p)
            too_long(p)
            ids = await run_in_threadpool(t.tokenize, p)
            if (t.add_bos or not ids) and t.bos_token_id is not None:
                ids = [t.bos_token_id] + ids
        else:
            if any(not 0 <= i < t.n_vocab for i in p):
                raise ApiError(400, f"token ids must be in 0..{t.n_vocab - 1}", param="prompt")
            ids = list(p)
        gen = gen_request(req, ids, req.max_tokens or 16)
        return await run_generation(request, req, gen, chat=False)

    async def chat_completions(request: Request):
        from assistd.runtime.chat import chat_prompt_ids, message_text

        data = await read_json(request)
        req = parse(ChatRequest, data)
        max_tokens = req.max_completion_tokens or req.max_tokens
        check_common(req, max_tokens)
        if req.tools:
            raise ApiError(400, "tools (function calling) are not supported", param="tools")
        messages = [{"role": m.role, "content": _valid(message_text(m.content))}
                    for m in req.messages]
        too_long("".join(m["content"] for m in messages))
        ids = await run_in_threadpool(chat_prompt_ids, service.target, messages)
        n_ctx = service.target.n_ctx
        gen = gen_request(req, ids, max_tokens or min(config.max_tokens_limit, n_ctx))
        return await run_generation(request, req, gen, chat=True)

    async def models(request: Request):
        return JSONResponse({"object": "list", "data": [{
            "id": service.model_id, "object": "model", "created": int(service.started_at),
            "owned_by": "assistd", "n_ctx": service.target.n_ctx,
            "backend": service.target.backend}]})

    async def model(request: Request):
        mid = request.path_params["model"]
        if mid not in (service.model_id, "assistd"):
            raise ApiError(404, f"the model {mid!r} does not exist", param="model",
                           code="model_not_found")
        return JSONResponse({"id": service.model_id, "object": "model",
                             "created": int(service.started_at), "owned_by": "assistd"})

    async def healthz(request: Request):
        return JSONResponse({"status": "ok", "model": service.model_id})

    async def stats(request: Request):
        scope = request.query_params.get("scope")
        out = await asyncio.wrap_future(service.submit(lambda: service.stats_job(scope),
                                                       EDITOR, "stats"))
        return JSONResponse({**out, "daemon": service.status()})

    async def status(request: Request):
        return JSONResponse(service.status())

    async def complete(request: Request):
        data = await read_json(request)
        if not isinstance(data.get("prompt_text"), str):
            raise ApiError(400, "prompt_text (a string) is required", param="prompt_text")
        n = data.get("max_tokens", 64)
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= config.max_tokens_limit:
            raise ApiError(400, f"max_tokens must be 1..{config.max_tokens_limit}",
                           param="max_tokens")
        return JSONResponse(await asyncio.wrap_future(service.complete_at(data)))

    async def lsp(request: Request):
        data = await read_json(request)
        session, op = data.get("session"), data.get("op")
        args = data.get("args") or {}
        if not isinstance(session, str) or not isinstance(op, str) or not isinstance(args, dict):
            raise ApiError(400, "need {session: str, op: str, args: object}")
        if op == "cancel":
            ev = lsp_inflight.get(str(args.get("request_id")))
            if ev is not None:
                ev.set()
            return JSONResponse({"cancelled": ev is not None})
        rid = args.get("request_id")
        if op == "complete" and rid:
            args["_cancel"] = lsp_inflight[str(rid)] = threading.Event()
        service.requests["lsp"] += op == "complete"
        fut = service.submit(lambda: service.lsp_job(session, op, args), EDITOR, f"lsp:{op}")
        try:
            result = await asyncio.wrap_future(fut)
        finally:
            if rid:
                lsp_inflight.pop(str(rid), None)
        return JSONResponse({"result": result})

    routes = [
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/models/{model:path}", model, methods=["GET"]),
        Route("/v1/assistd/stats", stats, methods=["GET"]),
        Route("/v1/assistd/status", status, methods=["GET"]),
        Route("/v1/assistd/complete", complete, methods=["POST"]),
        Route("/v1/assistd/lsp", lsp, methods=["POST"]),
        Route("/healthz", healthz, methods=["GET"]),
    ]

    async def on_api_error(request, exc: ApiError):
        return _error(exc.status, exc.message, exc.param, exc.code, exc.kind)

    async def on_error(request, exc: Exception):
        status, message = _status_of(exc)
        if status >= 500:
            log.error("%s %s failed: %s", request.method, request.url.path, message,
                      exc_info=exc if not isinstance(exc, AssistdError) else None)
        return _error(status, message, kind="server_error" if status >= 500
                      else "invalid_request_error")

    async def on_http(request, exc):
        return _error(exc.status_code, str(exc.detail), code="not_found"
                      if exc.status_code == 404 else None)

    from starlette.exceptions import HTTPException

    app = Starlette(routes=routes, exception_handlers={
        ApiError: on_api_error, AssistdError: on_error, ValueError: on_error,
        HTTPException: on_http, Exception: on_error})
    app.add_middleware(_TokenAuth, token=token)
    return app


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
    if isinstance(exc, ModelError):
        return 503, str(exc)
    if isinstance(exc, AssistdError):
        return 500, str(exc)
    if isinstance(exc, ValueError):
        return 400, str(exc)
    if isinstance(exc, RuntimeError) and "shutting down" in str(exc):
        return 503, "the daemon is shutting down; retry when it is back"
    return 500, f"internal error: {type(exc).__name__}: {exc}"


class _TokenAuth:
    """Pure ASGI middleware: a request over TCP needs ``Authorization: Bearer <token>``.

    uvicorn gives a Unix-socket connection the server address ``(path, None)``, a TCP
    one ``(host, port)``: everything but the former is checked."""

    def __init__(self, app, token: str | None):
        self.app, self.token = app, token

    async def __call__(self, scope, receive, send):
        server = scope.get("server")
        unix = isinstance(server, (tuple, list)) and len(server) == 2 and server[1] is None
        if scope["type"] == "http" and not unix:
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
