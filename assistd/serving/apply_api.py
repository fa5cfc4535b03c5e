"""Fast apply on the daemon and in-process: ``POST /v1/assistd/apply`` and the model callables.

:func:`assistd.edits.fast_apply.apply_edit` applies SEARCH/REPLACE blocks by rule; a
snippet goes to a model callable built here, which runs the merge chat
(:func:`assistd.edits.merge.merge_prompt`) on the Target with the original file, fenced
as the answer would be, as the predicted output (OpenAI's Predicted Outputs: the engine
drafts from it, :mod:`proposers.prediction`):

- :func:`daemon_model`: through the daemon's :class:`~assistd.serving.service.Service`
  queue (agent priority), from a worker thread;
- :func:`runtime_model`: on an in-process :class:`~assistd.runtime.runtime.Runtime`, on
  the thread that owns it (the MCP server's engine thread).

The endpoint (:func:`apply_endpoint`) takes ``{"path", "edit", "instruction"?, "output"?:
"diff"|"text", "repo"?}`` (no other key) and answers ``ApplyResult.as_dict()`` plus
``"object": "assistd.apply"``. ``path`` is absolute (the daemon has no working directory
of the client's), or relative to ``repo``; the scope is ``repo``, else the file's
repository root (:func:`storage.indexer.find_repository_root`). Errors are the API's:
a refused file, a block that does not apply, a cut-off answer are 400s.
"""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool
from starlette.responses import JSONResponse

from assistd.edits.fast_apply import apply_edit
from assistd.edits.merge import MergeJob, ModelFn, ModelRewrite, answer_budget
from assistd.ground.errors import InputError
from assistd.ground.paths import user_path
from assistd.runtime.scheduler import AGENT
from assistd.serving.openai_wire import parse_request, usage
from storage.indexer import find_repository_root, is_repository

MAX_PATH = 4096
OWNER = "apply"  # labels the generation's KV sequence in status


class ApplyRequest(BaseModel):
    """The body of ``POST /v1/assistd/apply`` (unknown keys refused)."""

    model_config = ConfigDict(extra="forbid")

    path: str = Field(min_length=1, max_length=MAX_PATH)
    edit: str = Field(min_length=1)
    instruction: str = Field("", max_length=MAX_PATH)
    output: Literal["diff", "text"] = "diff"
    repo: str | None = Field(None, min_length=1, max_length=MAX_PATH)


def edit_target(path: str, repo: str | None, *, cwd: Path | None = None) -> tuple[Path, Path]:
    """``(the file's absolute path, the scope)`` for an edit request. A relative ``path``
    is taken from ``repo``, else from ``cwd`` (the MCP server's; the daemon has none);
    the scope is ``repo``, else the nearest ancestor of the file's directory holding
    ``.git``. Raises InputError for a relative path with neither, and for a file in no
    git repository without ``repo`` (an agent must name the folder it may read)."""
    p = user_path(path)
    if not p.is_absolute():
        base = user_path(repo) if repo else cwd
        if base is None:
            raise InputError(f"path {path[:200]!r} is relative: pass an absolute path, or"
                             " repo to take it from")
        p = base / p
    p = Path(os.path.abspath(p))
    # the directory's repository (not the file's own resolved name: a link is refused as a
    # link by apply_edit, not taken to the repository it points into)
    scope = user_path(repo) if repo else find_repository_root(p.parent)
    if not repo and not is_repository(scope):
        raise InputError(f"{p} is in no git repository: pass repo (the project folder it"
                         " belongs to) to edit it")
    return p, scope


def merge_generation(target, job: MergeJob, tokens_of) -> tuple[list[int], list[int], int, str]:
    """``(prompt ids, prediction ids, max_tokens, stop)`` for a merge on ``target``.
    ``tokens_of``: the chat renderer (:func:`assistd.runtime.chat.chat_prompt_ids`).
    The stop string is the prediction's closing fence line, so a model that chats on
    after the file stops there (put back by :func:`_answer`). Raises InputError when the
    prompt and an unchanged answer do not fit the Target's context."""
    prompt = tokens_of(target, job.messages)
    prediction = target.tokenize(job.prediction)
    room = target.n_ctx - len(prompt)
    if room < len(prediction) + 8:
        raise InputError(
            f"{job.path}: too long to merge in the Target's context of {target.n_ctx} tokens"
            f" (prompt {len(prompt)}, an unchanged answer {len(prediction)}); send"
            " SEARCH/REPLACE blocks instead")
    want = answer_budget(len(prediction), len(target.tokenize(job.snippet)))
    fence = job.prediction.rsplit("\n", 1)[-1]
    return prompt, prediction, min(want, room), f"\n{fence}\n"


def _answer(text: str, stop_reason: str, stop: str) -> str:
    """The answer with the closing fence the stop string cut off put back."""
    return text + stop if stop_reason == "stop" else text


def daemon_model(service, cancel: threading.Event | None = None) -> ModelFn:
    """A model callable on the daemon: each merge is one generation queued at agent
    priority; call it from a worker thread (it waits for the result). ``cancel``: set
    it to stop the generation before its next round (the client hung up)."""
    from assistd.runtime.chat import chat_prompt_ids
    from assistd.serving.service import GenerationRequest
    from proposers.prediction import prediction_usage

    def model(job: MergeJob) -> ModelRewrite:
        prompt, prediction, max_tokens, stop = merge_generation(service.target, job,
                                                                chat_prompt_ids)
        gen = GenerationRequest(prompt=prompt, max_tokens=max_tokens, stop=(stop,),
                                language=job.language, owner=OWNER, prediction=prediction,
                                cancel=cancel or threading.Event())
        r = service.generate(gen, AGENT, "apply").result()
        return ModelRewrite(_answer(r.text, r.stop_reason, stop), usage(
            len(prompt), len(r.tokens), ledger=r.ledger, proposer=r.proposer, k=r.k,
            stop_reason=r.stop_reason, queue_ms=r.queue_ms,
            prediction=prediction_usage(prediction, r.tokens)))  # (this worker's thread)

    return model


def runtime_model(runtime, *, proposer: str = "suffix", k: int | str = "auto") -> ModelFn:
    """A model callable on an in-process Runtime (call it on the Runtime's thread):
    ``proposer``/``k`` plan the generation; the prediction drafts beside them."""
    from assistd.runtime.chat import chat_prompt_ids
    from proposers.prediction import prediction_usage

    def model(job: MergeJob) -> ModelRewrite:
        prompt, prediction, max_tokens, stop = merge_generation(runtime.target, job,
                                                                chat_prompt_ids)
        plan = runtime.plan(proposer, k, job.language)
        gen = runtime.run(prompt, plan, max_tokens=max_tokens, stop=(stop,), owner=OWNER,
                          prediction=prediction)
        return ModelRewrite(_answer(gen.text, gen.stop_reason, stop), usage(
            len(prompt), len(gen.tokens), ledger=gen.ledger.as_dict(),
            proposer="prediction" if plan.speculative else plan.proposer, k=plan.k,
            stop_reason=gen.stop_reason, queue_ms=0.0,
            prediction=prediction_usage(prediction, gen.tokens)))

    return model


def apply_request(body: dict, model: ModelFn | None, *, cwd: Path | None = None) -> dict:
    """One apply request (the endpoint's body as a dict) run to its answer. Blocking:
    file reads, and the model when the edit is a snippet. Raises InputError (an
    :class:`~assistd.serving.openai_wire.ApiError` 400 for a malformed body)."""
    req = parse_request(ApplyRequest, body)
    path, scope = edit_target(req.path, req.repo, cwd=cwd)
    result = apply_edit(path, req.edit, scope=scope, model=model, diff=req.output == "diff",
                        instruction=req.instruction)
    return {"object": "assistd.apply", **result.as_dict()}


def apply_endpoint(service, read_json):
    """The Starlette endpoint of ``POST /v1/assistd/apply`` on ``service``.
    ``read_json(request, limit)``: the API's body reader (size and depth limits), passed
    in so that this module need not import the API (which imports it)."""

    async def apply(request):
        body = await read_json(request, service.config.max_request_bytes)
        cancel = threading.Event()
        task = asyncio.ensure_future(run_in_threadpool(apply_request, body,
                                                       daemon_model(service, cancel)))
        try:  # a client that hangs up stops the merge within a round, as for completions
            while not task.done():
                await asyncio.wait({task}, timeout=0.25)
                if not task.done() and await request.is_disconnected():
                    cancel.set()
            return JSONResponse(await task)
        finally:
            cancel.set()

    return apply
