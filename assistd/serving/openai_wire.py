"""OpenAI's wire shapes for ``/v1/completions``, ``/v1/chat/completions`` and ``/v1/models``.

What this module holds, and nothing about HTTP or the service:

- the request models (pydantic): :class:`CompletionRequest`, :class:`ChatRequest` and
  its :class:`Message`, their common base, and the ``assistd`` extension
  :class:`AssistdOptions`; :func:`parse_request` turns a validation failure into a 400;
- :class:`ApiError` and the OpenAI error body (:func:`error_body`);
- the request checks that need only plain values (the model id, the config's limits,
  the context window): :func:`check_common` and the others named ``check_*``;
- pure builders of the response bodies: a completion or chat completion
  (:func:`completion_body`), a streamed chunk (:func:`chunk_body`,
  :func:`usage_chunk_body`), the ``usage`` object with its ``assistd`` part
  (:func:`usage`), the per-response ``metrics`` object (:func:`response_metrics`), the
  model list (:func:`model_list_body`, :func:`model_body`).

The shapes follow the OpenAI API reference:
https://platform.openai.com/docs/api-reference/completions and
https://platform.openai.com/docs/api-reference/chat. The bodies are plain dicts, their
keys in the order they go on the wire.
"""

from __future__ import annotations

import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from assistd.ground.errors import InputError
from assistd.ground.options import parse_k
from assistd.ground.sampling import SamplingParams


class ApiError(Exception):
    """A request the API refuses: ``status`` and the fields of OpenAI's error body."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 code: str | None = None, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = (
            status, message, param, code, kind)


def error_body(message: str, param=None, code=None, kind="invalid_request_error") -> dict:
    """``{"error": {"message", "type", "param", "code"}}``."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def error_type(status: int) -> str:
    """The error ``type`` for an HTTP status: ``server_error`` for 5xx, else
    ``invalid_request_error``."""
    return "server_error" if status >= 500 else "invalid_request_error"


# -- request models ----------------------------------------------------------------


class AssistdOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    proposer: str | None = None
    # Any here, checked in check_common: strict (an int or "auto", as OpenAI's types are
    # strict: not "8", not true) and with parse_k's message rather than pydantic's.
    k: Any = Field(None)
    scope: str | None = Field(None, max_length=4096)  # a path; longer ones are OS errors
    language: str | None = Field(None, pattern=r"^[A-Za-z0-9_.+#-]{1,64}$")
    priority: Literal["editor", "shell", "agent"] | None = None


class PredictionPart(BaseModel):
    """One part of a prediction's content: ``{"type": "text", "text": str}``."""
    model_config = ConfigDict(extra="forbid", strict=True)
    type: Literal["text"]
    text: str


class Prediction(BaseModel):
    """OpenAI's Predicted Outputs (``prediction``): ``{"type": "content", "content":
    str | [{"type": "text", "text": str}, ...]}``, the text the output is expected to
    mostly copy (a file being rewritten). A draft source for its request only."""
    model_config = ConfigDict(extra="forbid", strict=True)
    type: Literal["content"]
    content: str | list[PredictionPart]

    @property
    def text(self) -> str:
        """The predicted text: the string, or the parts' texts joined."""
        c = self.content
        return c if isinstance(c, str) else "".join(p.text for p in c)


class _Common(BaseModel):
    # strict: "5" is not a number of tokens, "yes" is not a boolean (as OpenAI answers)
    model_config = ConfigDict(extra="ignore", strict=True)
    model: str
    max_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0, le=2)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(0, ge=0)
    repetition_penalty: float = Field(1.0, gt=0)
    seed: int | None = Field(None, ge=0, lt=1 << 63)  # numpy's generator takes 64 bits
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: dict | None = None
    n: int = Field(1, ge=1)
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    logprobs: bool | int | None = None
    response_format: dict | None = None
    # OpenAI's other fields, typed so that a wrong type is a 400 like any other; what
    # this daemon cannot honour (best_of > 1, a logit bias) is refused in check_common.
    user: str | None = Field(None, max_length=256)
    best_of: int | None = Field(None, ge=1)
    logit_bias: dict[str, float] | None = None
    prediction: Prediction | None = None
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


class SamplingFields(BaseModel):
    """The ``sampling`` object of ``/v1/assistd/complete``: SamplingParams' fields."""
    model_config = ConfigDict(extra="forbid", strict=True)
    temperature: float = Field(0.0, ge=0, le=2)
    top_k: int = Field(0, ge=0, le=1 << 20)
    top_p: float = Field(1.0, gt=0, le=1)
    repetition_penalty: float = Field(1.0, gt=0, le=100)
    penalty_last_n: int = Field(64, ge=0, le=1 << 20)
    seed: int | None = Field(None, ge=0, lt=1 << 63)


class CompleteRequest(BaseModel):
    """``POST /v1/assistd/complete`` (``assistd complete``, the MCP tools): the keyword
    arguments of :func:`assistd.runtime.session.complete_at`. Unknown keys are refused
    (this is assistd's own endpoint: a misspelt option must not be silently dropped)."""
    model_config = ConfigDict(extra="forbid", strict=True)
    prompt_text: str
    repo: str | None = Field(None, max_length=4096)
    proposer: str = Field("suffix", max_length=64)
    k: int | str = "auto"  # checked by parse_k (message and range)
    max_tokens: int = Field(64, ge=1)  # and <= max_tokens_limit, checked by the API
    max_prompt_tokens: int = Field(1024, ge=1, le=1 << 20)
    stop: list[str] | None = Field(None, max_length=4)
    guess_outside_git: bool = False
    language: str | None = Field(None, pattern=r"^[A-Za-z0-9_.+#-]{1,64}$")
    sampling: SamplingFields | None = None
    client: Literal["cli", "mcp"] | None = None


def _validation_message(e: ValidationError) -> tuple[str, str | None]:
    err = e.errors()[0]
    loc = ".".join(str(x) for x in err["loc"])
    return f"{loc}: {err['msg']}" if loc else err["msg"], (loc or None)


def parse_request(model: type[BaseModel], data: dict):
    """``model`` validated from the JSON object ``data``; ApiError 400 naming the first
    bad field (``param``) otherwise."""
    try:
        return model.model_validate(data)
    except ValidationError as e:
        msg, param = _validation_message(e)
        raise ApiError(400, msg, param=param) from None


# -- request checks ----------------------------------------------------------------


def stop_list(stop: str | list[str] | None) -> list[str]:
    """The ``stop`` field as a list: one string, a list, or none."""
    return [stop] if isinstance(stop, str) else (stop or [])


def check_common(req: _Common, max_tokens: int | None, *, model_id: str,
                 max_tokens_limit: int, aliases: tuple[str, ...] = ("assistd",)) -> None:
    """The checks both endpoints share: the model (``model_id`` or one of ``aliases``),
    the fields this daemon does not support, ``max_tokens`` against ``max_tokens_limit``,
    at most 4 stop sequences, ``assistd.k``. Raises ApiError."""
    if req.model != model_id and req.model not in aliases:
        raise ApiError(404, f"the model {req.model!r} does not exist; this daemon serves"
                            f" {model_id!r} (see GET /v1/models)",
                       param="model", code="model_not_found")
    if req.n != 1:
        raise ApiError(400, "n > 1 is not supported; send separate requests", param="n")
    if req.logprobs:
        raise ApiError(400, "logprobs are not supported", param="logprobs")
    if req.response_format and req.response_format.get("type", "text") != "text":
        raise ApiError(400, "response_format other than text (JSON mode, schemas) is not"
                            " supported", param="response_format")
    if req.best_of not in (None, 1):
        raise ApiError(400, "best_of > 1 is not supported; send separate requests",
                       param="best_of")
    if req.logit_bias:
        raise ApiError(400, "logit_bias is not supported", param="logit_bias")
    if req.frequency_penalty or req.presence_penalty:
        raise ApiError(400, "frequency_penalty and presence_penalty are not supported;"
                            " use repetition_penalty", param="frequency_penalty")
    if max_tokens is not None and max_tokens > max_tokens_limit:
        raise ApiError(400, f"max_tokens {max_tokens} is over this daemon's limit of"
                            f" {max_tokens_limit} (max_tokens_limit)",
                       param="max_tokens")
    if len(stop_list(req.stop)) > 4:
        raise ApiError(400, "at most 4 stop sequences", param="stop")
    if "" in stop_list(req.stop):
        raise ApiError(400, "a stop sequence cannot be empty", param="stop")
    a = req.assistd
    if a is not None and a.k is not None:
        try:
            if a.k != "auto" and (isinstance(a.k, bool) or not isinstance(a.k, int)):
                raise InputError(f"assistd.k must be 'auto' or a number of tokens 0..64"
                                 f" (a JSON integer), not {a.k!r}")
            parse_k(a.k, what="assistd.k")
        except InputError as e:
            raise ApiError(400, str(e), param="assistd.k") from None


def completion_prompt(req: CompletionRequest) -> str | list[int]:
    """The one prompt of a /v1/completions request (text or token ids), after refusing
    ``echo``, ``suffix`` and a batch of prompts."""
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
    return p


def check_token_ids(ids: list[int], *, n_vocab: int) -> None:
    """A prompt given as token ids: each in ``0..n_vocab - 1``."""
    if any(not 0 <= i < n_vocab for i in ids):
        raise ApiError(400, f"token ids must be in 0..{n_vocab - 1}", param="prompt")


def check_chat(req: ChatRequest) -> None:
    """What /v1/chat/completions refuses beyond :func:`check_common`: ``tools``."""
    if req.tools:
        raise ApiError(400, "tools (function calling) are not supported", param="tools")


def check_prompt_bytes(text: str, *, n_ctx: int, max_piece: int,
                       param: str = "prompt") -> None:
    """Refuse a prompt (or a prediction: ``param``) that cannot fit before tokenizing
    megabytes of it: a token is at most ``max_piece`` bytes, so more bytes than that
    times n_ctx never fit."""
    size = len(text.encode("utf-8", "replace"))
    if size > n_ctx * max_piece:
        raise ApiError(400, f"the {param} is {size} bytes, more than this model's context"
                            f" window of {n_ctx} tokens can hold", param=param,
                       code="context_length_exceeded")


def check_prompt_tokens(n_prompt: int, *, n_ctx: int) -> None:
    """A tokenized prompt: not empty, and room in the context window for a token."""
    if not n_prompt:
        raise ApiError(400, "the prompt is empty", param="prompt")
    if n_prompt + 1 >= n_ctx:
        raise ApiError(400, f"the prompt is {n_prompt} tokens; this model's context"
                            f" window is {n_ctx} tokens", param="prompt",
                       code="context_length_exceeded")


def check_prediction_tokens(n_prediction: int, *, n_ctx: int) -> None:
    """A tokenized prediction: at most the context window (a longer one could never be
    copied whole: the output ends at the window's end)."""
    if n_prediction > n_ctx:
        raise ApiError(400, f"the prediction is {n_prediction} tokens; this model's context"
                            f" window is {n_ctx} tokens", param="prediction",
                       code="context_length_exceeded")


def check_proposer(name: str, known: list[str]) -> None:
    """``assistd.proposer`` must be one of ``known``."""
    if name not in known:
        raise ApiError(400, f"unknown proposer {name!r}; known here:"
                            f" {', '.join(known)}", param="assistd.proposer")


def sampling_of(req: _Common) -> SamplingParams:
    """The request's sampling fields as SamplingParams (ApiError 400 if they do not fit)."""
    try:
        return SamplingParams(temperature=req.temperature, top_k=req.top_k, top_p=req.top_p,
                              repetition_penalty=req.repetition_penalty, seed=req.seed)
    except ValueError as e:
        raise ApiError(400, str(e)) from None


def check_model(mid: str, *, model_id: str, aliases: tuple[str, ...] = ("assistd",)) -> None:
    """``GET /v1/models/{mid}``: ``model_id`` or one of ``aliases``, else a 404."""
    if mid != model_id and mid not in aliases:
        raise ApiError(404, f"the model {mid!r} does not exist", param="model",
                       code="model_not_found")


# -- response bodies ---------------------------------------------------------------


def response_id(chat: bool) -> str:
    """A fresh ``chatcmpl-…`` (chat) or ``cmpl-…`` id."""
    return ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]


def usage(prompt_tokens: int, completion_tokens: int, *, ledger: dict, proposer: str,
          k: int | str, stop_reason: str, queue_ms: float,
          prediction: tuple[int, int] | None = None) -> dict:
    """``{"prompt_tokens", "completion_tokens", "total_tokens",
    "completion_tokens_details", "assistd": {"ledger", "proposer", "k", "stop_reason",
    "queue_ms"}}``: OpenAI's usage plus the generation's ledger. ``prompt_tokens`` and
    ``completion_tokens`` are the ids counted here; for a remote Target they are
    :func:`remote_counts`'. ``completion_tokens_details`` has OpenAI's
    ``accepted_prediction_tokens`` and ``rejected_prediction_tokens`` (``prediction``:
    prediction tokens that did and did not appear in the completion; 0 and 0 without
    one) and ``reasoning_tokens`` 0; the drafts behind them are the ledger's
    ``by_source["prediction"]``."""
    if ledger.get("target") == "remote":
        prompt_tokens, completion_tokens = remote_counts(ledger)
    accepted, rejected = prediction or (0, 0)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "completion_tokens_details": {"reasoning_tokens": 0,
                                          "accepted_prediction_tokens": accepted,
                                          "rejected_prediction_tokens": rejected},
            "assistd": {"ledger": ledger, "proposer": proposer, "k": k,
                        "stop_reason": stop_reason, "queue_ms": queue_ms}}


# Plans that draw no draft here: plain decoding, and a remote Target's server.
UNDRAFTED = ("none", "remote")


def response_metrics(ledger: dict, *, proposer: str, k: int | str) -> dict:
    """``{"speculative_decoding": {...} | None}``: vLLM's per-request acceptance metrics
    (``--per-request-spec-decode-metrics summary``; a top-level ``metrics`` object beside
    ``usage``, which OpenAI's clients ignore), from the generation's own ledger
    (:meth:`assistd.ground.ledger.Ledger.as_dict`). ``None`` when the plan drafted
    nothing here (``proposer`` "none" or "remote"), as vLLM's with speculation off.

    Fields: ``num_spec_steps`` (rounds with a draft), ``num_draft_tokens``,
    ``num_accepted_draft_tokens`` (bonus tokens excluded), ``mean_acceptance_length``
    (1 + accepted / steps; None without steps), ``draft_acceptance_rate`` (accepted /
    drafted; None without drafts), ``num_spec_tokens`` (the draft ceiling ``k``; with
    ``"auto"``, the longest draft the generation made) and ``acceptance_histogram``
    (index j: steps that accepted exactly j draft tokens; ``num_spec_tokens + 1``
    entries). vLLM's ``acceptance_histogram_by_draft_length`` is left out: the ledger
    does not keep accepted counts by draft length.

    >>> m = response_metrics({"rounds": 3, "draft_tokens": 7, "accepted_tokens": 4,
    ...     "accepted_per_position": [2, 1, 1], "reached_per_position": [3, 2, 2],
    ...     "acceptance_rate": 4 / 7, "mean_acceptance_length": 1 + 4 / 3},
    ...     proposer="ngram", k=3)["speculative_decoding"]
    >>> m["acceptance_histogram"], m["num_spec_steps"], m["num_accepted_draft_tokens"]
    ([1, 1, 0, 1], 3, 4)
    """
    if proposer in UNDRAFTED:
        return {"speculative_decoding": None}
    rounds = int(ledger.get("rounds") or 0)
    at_least = [int(x) for x in ledger.get("accepted_per_position") or []]  # >= i+1 accepted
    longest = len(ledger.get("reached_per_position") or [])
    n = max(k if isinstance(k, int) else longest, len(at_least))
    at_least += [0] * (n - len(at_least))
    # exactly j accepted = (at least j) - (at least j + 1); at least 0 is every step
    histogram = [a - b for a, b in zip([rounds] + at_least, at_least + [0])]
    return {"speculative_decoding": {
        "mean_acceptance_length": ledger.get("mean_acceptance_length"),
        "draft_acceptance_rate": ledger.get("acceptance_rate"),
        "acceptance_histogram": histogram,
        "num_spec_steps": rounds,
        "num_accepted_draft_tokens": int(ledger.get("accepted_tokens") or 0),
        "num_draft_tokens": int(ledger.get("draft_tokens") or 0),
        "num_spec_tokens": n,
    }}


def remote_counts(ledger: dict) -> tuple[int, int]:
    """``(prompt tokens, completion tokens)`` of a remote generation's ledger (its
    ``RemoteLedger.as_dict()``): the server's own ``usage`` where it sent one, else the
    ledger's counts (the server's tokens as assistd counted them: in character mode,
    with no tokenizer known, the ids here are characters and the ledger's prompt is
    characters / 4, its completion one token per streamed chunk).

    >>> remote_counts({"prompt_tokens": 5, "committed_tokens": 4, "server_usage": None})
    (5, 4)
    >>> remote_counts({"prompt_tokens": 5, "committed_tokens": 4,
    ...                "server_usage": {"prompt_tokens": 6, "completion_tokens": 4}})
    (6, 4)
    """
    server = ledger.get("server_usage") or {}
    prompt, completion = server.get("prompt_tokens"), server.get("completion_tokens")
    return (int(prompt) if isinstance(prompt, int) else int(ledger.get("prompt_tokens") or 0),
            int(completion) if isinstance(completion, int)
            else int(ledger.get("committed_tokens") or 0))


def completion_body(rid: str, created: int, model: str, text: str, finish_reason: str,
                    usage: dict, *, chat: bool, metrics: dict | None = None) -> dict:
    """A non-streamed answer: ``{"id", "object", "created", "model", "choices": [one],
    "usage"}``, plus ``metrics`` when given (:func:`response_metrics`); the choice has
    ``message`` (chat) or ``text``."""
    choice = ({"index": 0, "message": {"role": "assistant", "content": text},
               "finish_reason": finish_reason, "logprobs": None} if chat else
              {"index": 0, "text": text, "finish_reason": finish_reason, "logprobs": None})
    return {"id": rid, "object": "chat.completion" if chat else "text_completion",
            "created": created, "model": model, "choices": [choice], "usage": usage,
            **({} if metrics is None else {"metrics": metrics})}


def _chunk_object(chat: bool) -> str:
    return "chat.completion.chunk" if chat else "text_completion"


def chunk_body(rid: str, created: int, model: str, *, chat: bool, text: str | None = None,
               finish_reason: str | None = None, first: bool = False,
               usage: dict | None = None, metrics: dict | None = None) -> dict:
    """One streamed chunk: ``{"id", "object", "created", "model", "choices": [one]}``,
    plus ``usage`` and ``metrics`` when given (the last one). A chat choice has a
    ``delta``: the first chunk's is ``{"role": "assistant", "content": ""}``, then
    ``{"content": text}``, and ``{}`` with no text; a text choice has ``text`` ("" with
    none)."""
    if chat:
        delta = {"role": "assistant", "content": ""} if first else (
            {"content": text} if text is not None else {})
        choice = {"index": 0, "delta": delta, "finish_reason": finish_reason,
                  "logprobs": None}
    else:
        choice = {"index": 0, "text": text or "", "finish_reason": finish_reason,
                  "logprobs": None}
    body = {"id": rid, "object": _chunk_object(chat), "created": created, "model": model,
            "choices": [choice]}
    if usage is not None:
        body["usage"] = usage
    if metrics is not None:
        body["metrics"] = metrics
    return body


def usage_chunk_body(rid: str, created: int, model: str, usage: dict, *, chat: bool,
                     metrics: dict | None = None) -> dict:
    """The chunk ``stream_options.include_usage`` asks for: ``"choices": []`` and
    ``usage``, plus ``metrics`` when given (where vLLM's streamed ``metrics`` ride)."""
    return {"id": rid, "object": _chunk_object(chat), "created": created, "model": model,
            "choices": [], "usage": usage, **({} if metrics is None else {"metrics": metrics})}


def model_list_body(model_id: str, created: int, *, n_ctx: int, backend: str) -> dict:
    """``GET /v1/models``: ``{"object": "list", "data": [the one model]}``."""
    return {"object": "list", "data": [{
        "id": model_id, "object": "model", "created": created, "owned_by": "assistd",
        "n_ctx": n_ctx, "backend": backend}]}


def model_body(model_id: str, created: int) -> dict:
    """``GET /v1/models/{id}``: ``{"id", "object": "model", "created", "owned_by"}``."""
    return {"id": model_id, "object": "model", "created": created, "owned_by": "assistd"}
