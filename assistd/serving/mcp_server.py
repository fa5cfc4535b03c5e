"""``assistd mcp``: an MCP server over stdio, so that coding agents can call assistd as tools.

Tools (names and arguments as the agent sees them):

- ``complete_code(path, line, column=None, max_tokens=64, stop=[])``: complete the
  code before a 1-based cursor of a file on disk, drafting from its repository's history.
- ``continue_text(text, max_tokens=64, stop=[], language="plaintext", repo=None)``:
  continue a given text.
- ``acceptance_stats(scope=None, full=False)``: what the tuner has measured (coverage,
  draft acceptance rate, mean acceptance length per language and proposer) and the
  users' acceptance of editor suggestions. It names no scope the agent did not name
  itself: the history holds every repository the user works in, and one agent's
  project is not told the others' paths. Without ``scope`` the figures cover all
  scopes and say how many (``scope_count``); a ``scope`` with no data is an error
  that lists no other scope.
- ``apply_edit(path, edit, instruction="", output="diff", repo=None)``: an edit to one
  file given back as a unified diff or the new text, never written
  (:mod:`assistd.edits.fast_apply`): SEARCH/REPLACE blocks apply by rule, in this
  process, with no model and no daemon; a lazy snippet is merged by the in-process
  Target (loaded then) with the file as its predicted output. The scope is ``repo``,
  else the file's repository root.

Every call first looks for the daemon (``assistd serve``, :func:`assistd.serving.client.find_daemon`;
a few ms), so a daemon started after this server is used from its next call. Without
one the work runs in this process: the Target, the history store and the tuner load on
the first completion (a few seconds) and stay loaded; all in-process work runs on one
engine thread (SQLite connections and the Target belong to the thread that uses them).

Errors the user can act on (:class:`assistd.ground.errors.AssistdError`: a missing file, a
line past the end, a bad scope) come back as tool errors (``isError``) carrying the
message; the server keeps running. stdout is the protocol: logs go to stderr.
"""

from __future__ import annotations

import asyncio
import logging
import re
import sqlite3
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Annotated, Any, Literal

import anyio.to_thread
from pydantic import BaseModel, Field

from assistd.ground.errors import AssistdError, InputError
from assistd.ground.paths import is_dir, user_path
from assistd.targets.spec import TargetSpec

log = logging.getLogger("assistd.mcp")

MAX_TOKENS_LIMIT = 1024  # the most tokens one tool call may ask for
MAX_PROMPT_TOKENS = 1024  # the tail of the prompt the Target sees, in tokens
MAX_STOPS = 4
NO_ROWS = "no ledger rows for scope"  # assistd.runtime.stats' error for a scope without data
LANGUAGE_RE = re.compile(r"[A-Za-z0-9_.+#-]{1,64}")

SERVER_INSTRUCTIONS = """\
assistd completes code and text with {model} (speculative decoding over a
history of your repositories and agent transcripts). Use complete_code to get the
model's continuation at a cursor in a file, continue_text for free text, and
acceptance_stats to see how well drafting from the history works per language.
Completions are short and greedy: treat them as suggestions, not as verified code.
apply_edit applies SEARCH/REPLACE blocks to a file and returns the diff (never writes)."""
REMOTE_INSTRUCTIONS = """\
assistd completes code and text with {model}, which decodes them (assistd
builds the prompts here; nothing drafts, so acceptance figures stay empty). Use
complete_code to get the model's continuation at a cursor in a file and continue_text
for free text. Completions are short and greedy: treat them as suggestions, not as
verified code. apply_edit applies SEARCH/REPLACE blocks to a file and returns the diff
(never writes)."""


def target_words(spec: TargetSpec | None,
                 daemon_status: dict | None = None) -> tuple[str, bool]:
    """``(the Target in a few words, whether it is remote)`` for the instructions and the
    tool descriptions: the daemon's Target when ``daemon_status`` (its
    ``/v1/assistd/status``) is given, else the in-process one ``spec`` names.

    >>> target_words(TargetSpec(backend="openai", target_url="http://h:8080", target_model="m"))
    ('the model m of the remote server http://h:8080', True)
    >>> target_words(TargetSpec())
    ('a small local model', False)
    """
    if daemon_status is not None:
        t = daemon_status.get("target") or {}
        remote = t.get("remote")
        if remote is not None:
            url, name = remote.get("url"), remote.get("model") or daemon_status.get("model")
        else:
            url, name = None, daemon_status.get("model")
    else:
        spec = spec or TargetSpec()
        url = spec.target_url if spec.remote else None
        name = spec.target_model if url else (Path(spec.model).stem if spec.model else None)
    if url:
        return (f"the model {name} of the remote server {url}" if name
                else f"the model of the remote server {url}"), True
    return (f"the local model {name}" if name else "a small local model"), False


class CompletionResult(BaseModel):
    """One completion and the key numbers of its ledger (rates as defined in docs/design.md, "Vocabulary")."""

    completion: str = Field(description="The generated text (stop strings excluded).")
    tokens: int = Field(description="Tokens generated (committed by the Target).")
    stop_reason: str = Field(description="Why generation ended: eos, stop, max_tokens, ...")
    language: str = Field(description="LSP language id the tuner filed the generation under.")
    proposer: str = Field(description="Draft proposer used (suffix, or none for plain decoding).")
    k: int | str = Field(description="Draft ceiling given: 'auto' (the tuner) or tokens.")
    daemon: bool = Field(description="True when the running daemon served the call, false"
                                     " when this MCP server ran the model itself.")
    acceptance_rate: float | None = Field(
        description="Accepted / drafted tokens (None when nothing was drafted).")
    mean_acceptance_length: float | None = Field(
        description="Tokens committed per verification round, 1 + accepted / rounds"
                    " (None without rounds).")
    coverage: float | None = Field(
        description="Rounds / decode steps: how often a draft existed at all.")
    tokens_per_s: float | None = Field(
        description="Decode throughput, generated tokens per second (prefill excluded).")
    draft_tokens: int = Field(description="Draft tokens proposed.")
    accepted_tokens: int = Field(description="Draft tokens the Target accepted.")
    rounds: int = Field(description="Verification rounds (steps that had a draft).")
    total_ms: float = Field(description="Wall time of the generation, milliseconds.")
    history_scope: str | None = Field(
        description="Repository whose history the drafts came from (None: none used).")
    history_tokens: int = Field(description="Tokens of history available to draft from.")


def completion_result(out: dict) -> CompletionResult:
    """The tool result of a ``Completion.as_dict()`` (from the daemon, with ``daemon``
    true, or from this process).

    >>> r = completion_result({"completion": " a + b", "tokens": 4, "stop_reason": "eos",
    ...     "language": "python", "proposer": "suffix", "k": "auto", "daemon": True,
    ...     "history": {"scope": None, "documents": 0, "tokens": 0},
    ...     "ledger": {"acceptance_rate": 0.5, "mean_acceptance_length": 2.0, "coverage": 0.5,
    ...                "tokens_per_s": 80.0, "draft_tokens": 2, "accepted_tokens": 1,
    ...                "rounds": 1, "total_ms": 50.0}})
    >>> r.completion, r.tokens, r.daemon, r.mean_acceptance_length
    (' a + b', 4, True, 2.0)
    """
    led = out.get("ledger") or {}
    hist = out.get("history") or {}
    return CompletionResult(
        completion=out["completion"], tokens=int(out["tokens"]),
        stop_reason=str(out.get("stop_reason")), language=out.get("language") or "plaintext",
        proposer=out.get("proposer") or "none", k=out.get("k", 0),
        daemon=bool(out.get("daemon")),
        acceptance_rate=led.get("acceptance_rate"),
        mean_acceptance_length=led.get("mean_acceptance_length"),
        coverage=led.get("coverage"), tokens_per_s=led.get("tokens_per_s"),
        draft_tokens=int(led.get("draft_tokens", 0)),
        accepted_tokens=int(led.get("accepted_tokens", 0)),
        rounds=int(led.get("rounds", 0)), total_ms=float(led.get("total_ms", 0.0)),
        history_scope=hist.get("scope"), history_tokens=int(hist.get("tokens") or 0))


# The fields of a stats entry (assistd.runtime.stats._entry) worth an agent's context; full=True
# returns all of them (per-position lists, speedup by k, the cost model).
_STATS_KEYS = ("language", "proposer", "target", "steps", "rounds", "draft_tokens",
               "accepted_tokens", "coverage", "acceptance_rate", "mean_acceptance_length",
               "chosen_k", "expected_speedup")


def stats_result(ledger: dict, user_acceptance: dict, *, daemon: bool, full: bool) -> dict:
    """The ``acceptance_stats`` result from a :func:`assistd.runtime.stats.stats_report` report
    and a :meth:`storage.suggestions.SuggestionStore.summary`. The report's ``scopes``
    (every repository's path) become ``scope_count``: an agent is told no scope it did
    not name (``scope`` is the one it asked for, or None).

    >>> r = stats_result({"db": "h.db", "scope": None, "scopes": ["/r", "/s"], "entries": [
    ...     {"language": "python", "proposer": "suffix", "rounds": 3, "cost_model": {}}]},
    ...     {}, daemon=False, full=False)
    >>> r["entries"], r["scope_count"], "scopes" in r
    ([{'language': 'python', 'proposer': 'suffix', 'rounds': 3}], 2, False)
    """
    entries = ledger.get("entries") or []
    if not full:
        entries = [{k: e[k] for k in _STATS_KEYS if k in e} for e in entries]
    return {"daemon": daemon, "db": ledger.get("db"), "scope": ledger.get("scope"),
            "scope_count": len(ledger.get("scopes") or []), "entries": entries,
            "user_acceptance": user_acceptance}


class InProcessEngine:
    """The Target, history store and tuner of this process, loaded on first use.

    Every method runs on one engine thread (``run``): the SQLite connection and the
    Target are used from the thread that opened them, one job at a time.
    ``spec``: the Target's settings (None: the defaults, the embedded model); ``db``:
    the history file (None = ``$ASSISTD_DB``, else the user data dir).
    """

    def __init__(self, spec: TargetSpec | None = None, db: Path | None = None):
        self.spec, self.db = spec or TargetSpec(), db
        self.store = None  # opened alone for stats: reports need no Target
        self.runtime = None
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="assistd-mcp-engine")

    async def run(self, fn, *args, **kwargs):
        """Run ``fn(*args, **kwargs)`` on the engine thread; returns its result."""
        return await asyncio.wrap_future(self._pool.submit(fn, *args, **kwargs))

    # -- on the engine thread ------------------------------------------------------

    def _open_store(self):
        if self.store is None:
            from assistd.runtime.runtime import open_store

            self.store = open_store(self.db)
        return self.store

    def _open_runtime(self):
        if self.runtime is None:
            from assistd.runtime.runtime import Runtime

            log.info("loading the Target (in-process; no daemon answers): %s", self.spec)
            self.runtime = Runtime.open(self.spec, store=self._open_store())
            t = self.runtime.target
            log.info("the Target in this process: backend %s, n_ctx %d, numerics %s, threads"
                     " %s, device %s", t.backend, t.n_ctx, t.numerics,
                     getattr(t, "n_threads", None), t.device)
        return self.runtime

    def complete(self, body: dict) -> dict:
        """:func:`assistd.runtime.session.complete_at` on this process's runtime;
        ``body`` as for ``POST /v1/assistd/complete``. Returns ``Completion.as_dict()``
        with ``daemon`` false. Raises :class:`AssistdError`."""
        from assistd.runtime.session import complete_at

        result = complete_at(
            body["prompt_text"], repo=Path(body["repo"]) if body.get("repo") else None,
            proposer=body["proposer"], k=body["k"], max_tokens=body["max_tokens"],
            max_prompt_tokens=body["max_prompt_tokens"], runtime=self._open_runtime(),
            stop=tuple(body["stop"]), language=body["language"],
            guess_outside_git=body["guess_outside_git"])
        return {**result.as_dict(), "daemon": False}

    def stats(self, scope: str | None) -> dict:
        """``{"ledger": stats_report(...), "user_acceptance": ...}`` from the history
        store (the Target is not loaded for this). Raises :class:`InputError` for a
        scope without data."""
        from assistd.runtime.runtime import store_stats

        return store_stats(self._open_store(), scope)

    def merge(self, job):
        """A lazy snippet's merge (:func:`assistd.serving.apply_api.runtime_model`) on this
        process's Runtime, loaded on first use (never for SEARCH/REPLACE). Engine thread."""
        from assistd.serving.apply_api import runtime_model

        return runtime_model(self._open_runtime())(job)

    def call(self, fn, *args):
        """``fn(*args)`` on the engine thread, waited for: from a worker thread only."""
        return self._pool.submit(fn, *args).result()

    def _close(self) -> None:
        if self.runtime is not None:
            self.runtime.close()  # the store too
        elif self.store is not None:
            self.store.close()
        self.runtime = self.store = None

    def close(self) -> None:
        """Release the Target and the store (waits for the job in hand)."""
        try:
            self._pool.submit(self._close).result(timeout=60)
        except Exception:  # noqa: BLE001 - shutting down anyway
            log.debug("closing the engine failed", exc_info=True)
        self._pool.shutdown(wait=False, cancel_futures=True)


class Assistant:
    """What the tools call: the daemon when one answers (checked on every call), else
    :class:`InProcessEngine`. ``use_daemon=False`` never asks the daemon; ``socket``
    overrides the daemon's socket path (default: the daemon's own configuration)."""

    def __init__(self, engine: InProcessEngine, use_daemon: bool = True,
                 socket: Path | None = None):
        self.engine, self.use_daemon, self.socket = engine, use_daemon, socket

    def _daemon(self):
        from assistd.serving.client import find_daemon

        return find_daemon(self.socket) if self.use_daemon else None

    async def _via_daemon(self, call):
        """``call(client)`` on the daemon, in a worker thread, or None when no daemon
        answers (before, or by the time the call failed). Raises the daemon's errors."""
        from assistd.serving.client import DaemonError

        client = await anyio.to_thread.run_sync(self._daemon)
        if client is None:
            return None
        try:
            return await anyio.to_thread.run_sync(call, client)
        except DaemonError:
            if await anyio.to_thread.run_sync(client.healthy):
                raise  # it answers: the error is the daemon's verdict, not an absence
            log.warning("the daemon on %s stopped answering; running in-process", client.path)
            return None
        finally:
            client.close()

    async def complete(self, body: dict) -> dict:
        """A completion (``Completion.as_dict()`` plus ``daemon``)."""
        out = await self._via_daemon(lambda c: c.post("/v1/assistd/complete", body))
        if out is None:
            out = await self.engine.run(self.engine.complete, body)
        return out

    async def stats(self, scope: str | None, full: bool) -> dict:
        """:func:`stats_result` of the daemon's ledger, else this process's. Raises
        InputError for a ``scope`` without data, naming no other scope (the report's
        error lists the scopes that have data)."""
        params = {"scope": scope} if scope is not None else {}
        try:
            out = await self._via_daemon(lambda c: c.get("/v1/assistd/stats", **params))
            daemon = out is not None
            if out is None:
                out = await self.engine.run(self.engine.stats, scope)
        except AssistdError as e:
            if NO_ROWS in str(e):
                raise InputError(f"{NO_ROWS} {scope!r}; omit scope for the figures over"
                                 " every scope") from None
            raise
        return stats_result(out["ledger"], out.get("user_acceptance") or {}, daemon=daemon,
                            full=full)

    async def apply(self, body: dict) -> dict:
        """The daemon's ``POST /v1/assistd/apply`` when one answers (its Target merges a
        snippet, already loaded), else :func:`assistd.serving.apply_api.apply_request` in
        a worker thread (the file read and the blocks applied there, with no Target; a
        snippet's merge handed to the engine thread). Relative paths are taken from this
        server's working directory (the daemon has none of the client's)."""
        from assistd.serving.apply_api import apply_request
        from assistd.serving.openai_wire import ApiError

        sent = dict(body)
        for key in ("path", "repo"):  # the daemon takes absolute paths only
            if sent.get(key) and not Path(sent[key]).expanduser().is_absolute():
                if key == "repo" or not sent.get("repo"):
                    sent[key] = str(Path.cwd() / sent[key])
        out = await self._via_daemon(lambda c: c.post("/v1/assistd/apply", sent))
        if out is not None:
            return {**out, "daemon": True}
        engine = self.engine

        def run() -> dict:
            try:
                return {**apply_request(body, lambda job: engine.call(engine.merge, job),
                                        cwd=Path.cwd()), "daemon": False}
            except ApiError as e:  # the body's shape, as the API words it
                raise InputError(e.message) from None

        return await anyio.to_thread.run_sync(run)


# Argument types shared by the tools (module level: the SDK evaluates the annotations
# in this module's globals).
MaxTokens = Annotated[int, Field(ge=1, le=MAX_TOKENS_LIMIT,
                                 description="Most tokens to generate (1-1024).")]
Stops = Annotated[list[str], Field(max_length=MAX_STOPS, description=(
    "Up to 4 strings that end the completion where they first appear (excluded from"
    " it), e.g. [\"\\n\\n\"] for one paragraph or block."))]


def _request(prompt_text: str, *, repo: Path | None, language: str, max_tokens: int,
             stop: list[str]) -> dict:
    """The body of ``POST /v1/assistd/complete`` (also what the in-process engine takes)."""
    return {"prompt_text": prompt_text, "repo": str(repo) if repo is not None else None,
            "proposer": "suffix", "k": "auto", "max_tokens": max_tokens,
            "max_prompt_tokens": MAX_PROMPT_TOKENS, "stop": [s for s in stop if s],
            "language": language, "guess_outside_git": True, "sampling": {}, "client": "mcp"}


def _file_prompt(path: str, line: int, column: int | None) -> tuple[str, Path | None]:
    """``(text before the cursor, default repository)`` of ``path``. Raises
    :class:`InputError` naming the file (missing, a directory, binary) or the position."""
    from assistd.runtime.session import read_prompt

    if not path or path == "-":
        raise InputError("path must name a file (absolute, or relative to the MCP server's"
                         " working directory)")
    p = user_path(path)
    if not p.exists():
        raise InputError(f"file not found: {p}; pass the path of an existing file (absolute,"
                         f" or relative to {Path.cwd()})")
    if not p.is_file():
        raise InputError(f"not a file: {p}; pass the path of a file")
    try:
        _, prompt_text, repo = read_prompt(str(p), line, column)
    except InputError as e:  # name the file the position is in (the message may already)
        raise InputError(str(e) if str(p) in str(e) else f"{p}: {e}") from None
    return prompt_text, repo


async def _tool_errors(coro):
    """Await ``coro``; errors become :class:`ToolError` (an ``isError`` result whose
    text the agent reads) instead of the SDK's generic crash message."""
    from mcp.server.mcpserver.exceptions import ToolError

    try:
        return await coro
    except ToolError:
        raise
    except AssistdError as e:
        raise ToolError(str(e)) from None
    except sqlite3.OperationalError as e:  # e.g. locked past the busy timeout
        raise ToolError(f"history database: {e}; retry, or set ASSISTD_DB to another file"
                        ) from None
    except Exception as e:  # noqa: BLE001 - a tool call must never take the server down
        log.exception("tool call failed")
        raise ToolError(f"internal error: {type(e).__name__}: {e}") from None


_COMPLETE_CODE = """\
Complete the code at a cursor in a file on disk with {model}.

The model sees the file's text before the cursor (the text after it is ignored){drafts}.
Returns the completion and its ledger: tokens, {figures}tokens_per_s, and daemon
(whether the running `assistd serve` daemon served it). Errors (missing file, line or
column past the end) come back as tool errors."""
_CONTINUE_TEXT = """\
Continue a text with {model} (greedy{how}).

Returns the continuation and its ledger: tokens, {figures}tokens_per_s, and daemon
(whether the running `assistd serve` daemon served it). Only the last 1024 tokens of
the text are seen."""
_APPLY_EDIT = """\
Apply an edit to one file and get back a unified diff (output="diff", the default) or the
new text (output="text"). The file is never written: apply the diff yourself.

The edit is either SEARCH/REPLACE blocks, applied by rule at once (no model): a line
"<<<<<<< SEARCH", the exact lines to find, a line "=======", the lines to put there, a
line ">>>>>>> REPLACE"; several blocks apply in order. Each SEARCH must match exactly one
place (exact, else ignoring indentation, which is then reported); no match or several is
an error that names the block. Or a code snippet with the unchanged parts elided by
comments such as "// ... existing code ...": {model} merges it, with the original file
as its predicted output (slower; check the diff, and read warnings).

The result says how each block matched and whether the file parsed before and after
(broke: true when the edit broke a file that parsed). Files outside the repository (or
repo), ignored files (.env, keys, .git/, .gitignore'd), links, binary and non-UTF-8 files
are refused."""
_LOCAL_FIGURES = ("acceptance_rate (accepted / drafted tokens), mean_acceptance_length"
                  " (tokens per verification round), ")


def descriptions(model: str, remote: bool) -> dict[str, str]:
    """The server's instructions and the generating tools' descriptions for the
    Target ``model`` (:func:`target_words`): a remote one decodes on its server, so no
    drafting and no acceptance figures are promised."""
    if remote:
        out = {"instructions": REMOTE_INSTRUCTIONS.format(model=model),
                "complete_code": _COMPLETE_CODE.format(model=model, drafts="", figures=""),
                "continue_text": _CONTINUE_TEXT.format(model=model, how="; the server decodes",
                                                       figures=""),
                "apply_edit": _APPLY_EDIT.format(model=model)}
    else:
        out = _local_descriptions(model)
    # one line per paragraph: the templates' line breaks fall mid-sentence once filled
    return {k: "\n\n".join(" ".join(p.split()) for p in v.split("\n\n")) for k, v in out.items()}


def _local_descriptions(model: str) -> dict[str, str]:
    drafts = (" and drafts from the history of the file's git repository (indexed"
              " incrementally on first use), so completions follow the repository's own code")
    return {"instructions": SERVER_INSTRUCTIONS.format(model=model),
            "complete_code": _COMPLETE_CODE.format(model=model, drafts=drafts,
                                                   figures=_LOCAL_FIGURES),
            "continue_text": _CONTINUE_TEXT.format(model=model, how=", speculative decoding",
                                                   figures=_LOCAL_FIGURES),
            "apply_edit": _APPLY_EDIT.format(model=model)}


def build_server(assistant: Assistant, target: tuple[str, bool] = ("a small local model", False)):
    """The :class:`mcp.server.mcpserver.MCPServer` with the four tools over ``assistant``;
    ``target``: :func:`target_words` of the Target the tools run on (their descriptions
    and the instructions say it)."""
    from mcp.server.mcpserver import MCPServer
    from mcp.types import ToolAnnotations

    from assistd import __version__

    words = descriptions(*target)
    server = MCPServer("assistd", version=__version__, instructions=words["instructions"],
                       log_level="WARNING")
    generating = ToolAnnotations(read_only_hint=False, destructive_hint=False,
                                 idempotent_hint=False, open_world_hint=False)

    @server.tool(annotations=generating, description=words["complete_code"])
    async def complete_code(
        path: Annotated[str, Field(description="File to complete in: an absolute path, or"
                                               " relative to the server's working directory.")],
        line: Annotated[int, Field(ge=1, description="1-based line of the cursor.")],
        column: Annotated[int | None, Field(ge=1, description=(
            "1-based character column of the cursor; the column just past the line's last"
            " character is its end. Omit for the end of the line."))] = None,
        max_tokens: MaxTokens = 64,
        stop: Stops = [],  # noqa: B006 - pydantic copies defaults
    ) -> CompletionResult:
        """The completion at a cursor in a file (description: :data:`_COMPLETE_CODE`)."""
        from assistd.ground.languages import language_id

        async def go():
            prompt_text, repo = await anyio.to_thread.run_sync(_file_prompt, path, line, column)
            body = _request(prompt_text, repo=repo, language=language_id(path),
                            max_tokens=max_tokens, stop=stop)
            return completion_result(await assistant.complete(body))

        return await _tool_errors(go())

    @server.tool(annotations=generating, description=words["continue_text"])
    async def continue_text(
        text: Annotated[str, Field(min_length=1, description="The text to continue.")],
        max_tokens: MaxTokens = 64,
        stop: Stops = [],  # noqa: B006 - pydantic copies defaults
        language: Annotated[str, Field(pattern=LANGUAGE_RE.pattern, description=(
            "LSP language id of the text (python, markdown, typescript, ...): the draft"
            " length is tuned per language."))] = "plaintext",
        repo: Annotated[str | None, Field(description=(
            "A git repository (or a directory `assistd index` took) whose history drafts"
            " come from; omit to draft from the text alone."))] = None,
    ) -> CompletionResult:
        """The continuation of a text (description: :data:`_CONTINUE_TEXT`)."""

        async def go():
            root = None
            if repo:
                root = user_path(repo)
                if not is_dir(root):
                    raise InputError(f"repo {repo!r} is not a directory; pass a repository"
                                     " path, or omit repo")
            body = _request(text, repo=root, language=language, max_tokens=max_tokens,
                            stop=stop)
            return completion_result(await assistant.complete(body))

        return await _tool_errors(go())

    @server.tool(annotations=ToolAnnotations(read_only_hint=True, open_world_hint=False))
    async def acceptance_stats(
        scope: Annotated[str | None, Field(description=(
            "Only this history scope: a repository root (or a path that resolves to one);"
            " \"\" for completions made outside any repository. Omit for all (their"
            " paths are not listed: scope_count says how many)."))] = None,
        full: Annotated[bool, Field(description=(
            "Also per-position acceptance, expected speedup by draft ceiling k and the"
            " cost model (long)."))] = False,
    ) -> dict[str, Any]:
        """What assistd's tuner has measured about speculative decoding, per language id
        and proposer, plus how often users accepted editor suggestions.

        Per entry: coverage (verification rounds / decode steps: how often a draft
        existed), acceptance_rate (accepted / drafted tokens), mean_acceptance_length
        (1 + accepted / rounds, tokens per round), the draft ceiling k the tuner picks
        (chosen_k) and its expected speedup over plain decoding. Counters decay with
        age. user_acceptance counts editor suggestions shown, accepted, partially
        accepted and dismissed per language (a different quantity from draft acceptance).
        """
        return await _tool_errors(assistant.stats(scope, full))

    @server.tool(annotations=ToolAnnotations(read_only_hint=True, destructive_hint=False,
                                             idempotent_hint=True, open_world_hint=False),
                 description=words["apply_edit"])
    async def apply_edit(
        path: Annotated[str, Field(min_length=1, description=(
            "The file to edit: absolute, or relative to the server's working directory"
            " (to repo when repo is given)."))],
        edit: Annotated[str, Field(min_length=1, description=(
            "SEARCH/REPLACE blocks, or a code snippet with '... existing code ...'"
            " comments for the unchanged parts."))],
        instruction: Annotated[str, Field(max_length=4096, description=(
            "One line on what the edit does, for the model merging a snippet."))] = "",
        output: Annotated[Literal["diff", "text"], Field(description=(
            "diff: a unified diff a/PATH -> b/PATH; text: the whole new file."))] = "diff",
        repo: Annotated[str | None, Field(description=(
            "The directory the file must be inside; omit for its git repository root."))
                        ] = None,
    ) -> dict[str, Any]:
        """An edit applied to a file, never written (description: :data:`_APPLY_EDIT`)."""
        body = {"path": path, "edit": edit, "instruction": instruction, "output": output}
        if repo is not None:
            body["repo"] = repo
        return await _tool_errors(assistant.apply(body))

    return server


def _target_now(assistant: Assistant, spec: TargetSpec) -> tuple[str, bool]:
    """:func:`target_words` of the Target calls go to now: the daemon's when one answers
    (a few ms), else this process's (a daemon started later serves calls but the
    descriptions, read once by the agent, stay)."""
    client = assistant._daemon()
    if client is not None:
        try:
            return target_words(None, client.get("/v1/assistd/status"))
        except Exception:  # noqa: BLE001 - it stopped answering: this process serves
            log.debug("the daemon's status did not come", exc_info=True)
        finally:
            client.close()
    return target_words(spec)


def serve_stdio(*, use_daemon: bool = True, spec: TargetSpec | None = None,
                db: Path | None = None) -> None:
    """Run the MCP server on stdin/stdout until the client closes stdin.

    ``use_daemon``: look for the daemon on every call; ``spec`` (the Target's settings)
    and ``db``: the in-process Target and history when no daemon answers.
    """
    engine = InProcessEngine(spec, db=db)
    assistant = Assistant(engine, use_daemon=use_daemon)
    server = build_server(assistant, _target_now(assistant, engine.spec))
    try:
        server.run("stdio")
    finally:
        engine.close()
