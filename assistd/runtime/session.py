"""The shell front end's part: read a file at a (line, column) cursor and complete there
on a :class:`~assistd.runtime.runtime.Runtime` (``assistd complete``, in-process or
through the daemon, and the MCP ``complete`` tool)."""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

from assistd.decoding.engine import Generation
from assistd.ground.errors import InputError
from assistd.ground.ledger import Ledger
from assistd.ground.numerics import EXACT_PROMISE
from assistd.ground.options import parse_k
from assistd.ground.sampling import GREEDY, SamplingParams
from assistd.runtime.runtime import Runtime
from assistd.targets.base import Target
from assistd.targets.spec import TargetSpec
from storage.indexer import IndexReport, find_repository_root, is_repository
from storage.walk import Refused, open_checked

# The most `assistd complete` reads from --file or stdin (bytes): the whole file is read
# for its line numbers, and /dev/zero behind a link must end in an error, not in swap.
MAX_PROMPT_FILE_BYTES = 64 * 2**20

def cursor_offset(text: str, line: int | None, column: int | None) -> int:
    """Character offset of a 1-based (line, column) in ``text``; None means end of line / file.

    Line endings (LF, CRLF, CR) are not part of a line's columns; the column just
    past a line's last character (its end) is valid. Raises :class:`InputError`
    for a position past the end, or a line or column below 1.

    >>> cursor_offset("ab\\ncd\\n", 2, 2), cursor_offset("ab\\ncd\\n", 1, None), cursor_offset("ab", None, None)
    (4, 2, 2)
    """
    if line is None:
        if column is not None:
            raise InputError("--column needs --line")
        return len(text)
    if line < 1 or (column is not None and column < 1):
        raise InputError(f"line {line}, column {column}: lines and columns are 1-based")
    # LF, CRLF and CR only (as LSP and editors count), not str.splitlines' form feed,
    # U+2028 and friends: a form feed inside a line must not shift the cursor.
    lines = re.findall(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+$", text)
    if text == "" or text.endswith(("\n", "\r")):
        lines.append("")  # the empty line after a final newline
    if line > len(lines):
        raise InputError(
            f"line {line} is past the end of the file ({len(lines)} lines); lines are 1-based"
        )
    start = sum(len(x) for x in lines[: line - 1])
    content = lines[line - 1].rstrip("\r\n")
    if column is None:
        column = len(content) + 1
    if column > len(content) + 1:
        raise InputError(
            f"column {column} is past the end of line {line} ({len(content)} characters);"
            " columns are 1-based characters, the last valid one is the end of the line"
        )
    return start + column - 1


def read_prompt(file_: str, line: int | None, column: int | None) -> tuple[str, str, Path | None]:
    """Read the file (or stdin for ``-``) -> ``(text, text before the cursor, default repo)``.

    The default repository is the file's git root, else its directory. For stdin
    it is the current directory's git root, else None (no history): reading a
    prompt from stdin in ``$HOME`` must not index the dotfiles there.
    """
    if file_ == "-":
        data = sys.stdin.buffer.read(MAX_PROMPT_FILE_BYTES + 1)
        root = find_repository_root(Path.cwd())
        repo = root if is_repository(root) else None
    else:
        path = Path(file_)
        try:  # a FIFO or a device (or a link to one) is refused, never read or waited on
            with open_checked(path, follow=True) as f:
                data = f.read(MAX_PROMPT_FILE_BYTES + 1)
        except FileNotFoundError:
            raise InputError(
                f"file not found: {path}; pass an existing file to --file, or - for stdin"
            ) from None
        except Refused as e:
            raise InputError(f"not a file: {path} is {e.reason}; pass a regular file to --file,"
                             " or - for stdin") from None
        except OSError as e:
            raise InputError(f"cannot read {path}: {e.strerror}") from None
        repo = find_repository_root(path.resolve().parent)
    if len(data) > MAX_PROMPT_FILE_BYTES:
        raise InputError(f"{'stdin' if file_ == '-' else file_} is over"
                         f" {MAX_PROMPT_FILE_BYTES // 2**20} MiB; a completion"
                         " reads the whole file: pass a smaller one")
    if b"\0" in data[:8192]:
        raise InputError(f"{'stdin' if file_ == '-' else file_} looks binary (NUL byte);"
                         " completion needs a text file")
    text = data.decode("utf-8", errors="replace")
    return text, text[: cursor_offset(text, line, column)], repo


@dataclass
class Completion:
    """What ``complete`` returns: the generation plus where it came from."""

    generation: Generation
    target: Target
    history: dict
    index: IndexReport | None
    proposer: str
    k: int | str  # the ceiling given, or "auto"
    sampling: SamplingParams = GREEDY
    language: str = "plaintext"
    tuned: dict | None = None  # with k="auto": the tuner's estimate behind its choice

    def as_dict(self) -> dict:
        g = self.generation
        return {
            "completion": g.text,
            "tokens": len(g.tokens),
            "stop_reason": g.stop_reason,
            "target": {"backend": self.target.backend, "model": self.target.model_path,
                       "n_ctx": self.target.n_ctx, "device": self.target.device,
                       "threads": getattr(self.target, "n_threads", None),
                       "numerics": self.target.numerics, "promise": self.target.promise,
                       "speculation_off": self.target.speculation_off},
            "sampling": self.sampling.as_dict(),
            "proposer": self.proposer,
            "k": self.k,
            "language": self.language,
            "tuner": self.tuned,
            "history": self.history,
            "index": self.index.as_dict() if self.index else None,
            "ledger": g.ledger.as_dict(),
            "speculation_off": g.speculation_off,  # why the proposer given was not used
        }


def complete_at(
    prompt_text: str,
    *,
    repo: Path | None,
    proposer: str = "suffix",
    k: int | str = "auto",
    max_tokens: int = 64,
    max_prompt_tokens: int = 1024,
    spec: TargetSpec | None = None,
    db: Path | None = None,
    runtime: Runtime | None = None,
    sampling: SamplingParams = GREEDY,
    stop: tuple[str, ...] = (),
    guess_outside_git: bool = False,
    draft_model: Path | None = None,
    language: str = "plaintext",
    between_rounds=None,
    owner: str = "complete",
) -> Completion:
    """``assistd complete``: complete ``prompt_text`` with speculative decoding, drafting
    from ``repo``'s history, on ``runtime`` (None: one opened from ``spec``, the Target's
    settings, and ``db``, see :meth:`Runtime.open`).

    The repository is indexed incrementally first. ``proposer="none"`` (or k=0) is
    plain decoding through the same loop. ``sampling`` is greedy by default;
    ``stop`` strings end the completion (excluded from it). A kept runtime also keeps
    the Target's KV cache, so a second request on the same prefix evaluates only the
    new tokens. With ``guess_outside_git`` (``repo`` was inferred, not chosen) a
    directory outside git is drafted from only if ``assistd index`` took it before.
    ``proposer`` is a registered name (``suffix``, ``ngram``, ``draft_model`` with
    ``draft_model`` = the draft's GGUF, or a ``peer:...`` rule) or ``"none"``.

    ``k`` is the draft ceiling (tokens), or ``"auto"``: the tuner picks it per step for
    ``language`` (an LSP language id) from the persisted ledger. Either way the
    generation's counters are added to the ledger (one transaction) and its verify
    times to the Target's cost model. ``between_rounds`` goes to the engine (the
    daemon's preemption hook); ``owner`` labels the KV sequence it uses. Raises :class:`InputError`, :class:`ModelError`,
    :class:`HistoryError`.
    """
    spec = spec or TargetSpec()
    window = runtime.target.n_ctx if runtime is not None else spec.n_ctx
    if max_tokens + 1 >= window:
        raise InputError(f"--max-tokens {max_tokens} does not fit --n-ctx {window}")
    k = parse_k(k)  # before the model loads: a bad k fails fast
    if runtime is None:
        runtime = Runtime.open(spec, db=db, seed=sampling.seed)
    target = runtime.target
    speculate = proposer != "none" and k != 0
    scope = runtime.resolve_scope(repo, chosen=not guess_outside_git, refresh=True,
                                  index=speculate)
    history = {"scope": None, "documents": 0, "tokens": 0}
    if speculate and scope.root is not None:
        history = runtime.store.scope_summary(scope.root, target.fingerprint)
    budget = min(max_prompt_tokens, target.n_ctx - max_tokens - 1)
    ids = runtime.prompt(prompt_text, budget)
    plan = runtime.plan(proposer, k, language, history=scope.root is not None,
                        draft_model=draft_model)
    gen = runtime.run(ids, plan, scope=scope.root, max_tokens=max_tokens, sampling=sampling,
                      stop=stop, between_rounds=between_rounds, owner=owner)
    return Completion(generation=gen, target=target, history=history, index=scope.report,
                      proposer=plan.proposer, k=plan.k, sampling=sampling,
                      language=language, tuned=runtime.estimate(plan))


def ledger_line(c: Completion) -> str:
    """The one line ``assistd complete`` prints to stderr for ``c``."""
    return summary_line(c.as_dict())


def summary_line(out: dict) -> str:
    """The stderr line of a ``Completion.as_dict()``, made here or by the daemon (whose
    ``daemon`` key adds ``daemon=yes``): the same line either way, a remote Target's
    ``target=remote`` summary included; ``promise=batch-argmax`` where the Target's
    drafts were verified without exact numerics (:mod:`assistd.ground.numerics`)."""
    line = ledger_of(out["ledger"]).summary() + f" stop={out['stop_reason']}"
    promise = (out.get("target") or {}).get("promise")
    if promise not in (None, EXACT_PROMISE) and out["ledger"].get("rounds"):
        line += f" promise={promise}"
    if out.get("speculation_off"):
        line += f" speculation=off ({out['speculation_off']})"
    return line + (" daemon=yes" if out.get("daemon") else "")


def ledger_of(data: dict) -> Ledger:
    """A ledger back from its ``as_dict()``: a :class:`RemoteLedger` when it says
    ``target: remote``, else a :class:`Ledger` (the computed rates are dropped)."""
    cls = Ledger
    if data.get("target") == "remote":
        from assistd.targets.remote import RemoteLedger  # (httpx: only for a remote one)

        cls = RemoteLedger
    kept = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
    if "server_usage" in kept:
        kept["server_usage"] = kept["server_usage"] or {}  # None on the wire
    return cls(**kept)

