"""Glue shared by the front ends: open the Target and the history, complete at a cursor.

This is the one engine path (history -> proposer -> Target -> verification ->
ledger) that the CLI calls today and the LSP server and local API will call later.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

from assistd.decoding.engine import Generation, generate
from assistd.ground.errors import InputError, ModelError
from assistd.ground.sampling import GREEDY, SamplingParams
from assistd.targets.base import Target
from assistd.targets.open import open_target
from storage.indexer import (
    IndexReport,
    find_repository_root,
    index_repository,
    is_repository,
)
from storage.store import HistoryStore, default_db_path

def open_store(db: Path | None) -> HistoryStore:
    return HistoryStore(db if db is not None else default_db_path())


def cursor_offset(text: str, line: int | None, column: int | None) -> int:
    """Character offset of a 1-based (line, column) in ``text``; None means end of line / file.

    Line endings (LF, CRLF, CR) are not part of a line's columns; the column just
    past a line's last character (its end) is valid. Raises :class:`InputError`
    for a position past the end.

    >>> cursor_offset("ab\\ncd\\n", 2, 2), cursor_offset("ab\\ncd\\n", 1, None), cursor_offset("ab", None, None)
    (4, 2, 2)
    """
    if line is None:
        if column is not None:
            raise InputError("--column needs --line")
        return len(text)
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
        data = sys.stdin.buffer.read()
        root = find_repository_root(Path.cwd())
        repo = root if is_repository(root) else None
    else:
        path = Path(file_)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise InputError(
                f"file not found: {path}; pass an existing file to --file, or - for stdin"
            ) from None
        except IsADirectoryError:
            raise InputError(f"not a file: {path}; pass a file to --file") from None
        except OSError as e:
            raise InputError(f"cannot read {path}: {e.strerror}") from None
        repo = find_repository_root(path.resolve().parent)
    if b"\0" in data[:8192]:
        raise InputError(f"{file_} looks binary (NUL byte); completion needs a text file")
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
                       "numerics": self.target.numerics,
                       "speculation_off": self.target.speculation_off},
            "sampling": self.sampling.as_dict(),
            "proposer": self.proposer,
            "k": self.k,
            "language": self.language,
            "tuner": self.tuned,
            "history": self.history,
            "index": self.index.as_dict() if self.index else None,
            "ledger": g.ledger.as_dict(),
        }


def complete_at(
    prompt_text: str,
    *,
    repo: Path | None,
    proposer: str = "suffix",
    k: int | str = "auto",
    max_tokens: int = 64,
    max_prompt_tokens: int = 1024,
    n_ctx: int = 2048,
    model: Path | None = None,
    db: Path | None = None,
    target: Target | None = None,
    store: HistoryStore | None = None,
    sampling: SamplingParams = GREEDY,
    stop: tuple[str, ...] = (),
    target_options: dict | None = None,
    guess_outside_git: bool = False,
    draft_model: Path | None = None,
    language: str = "plaintext",
    tuner=None,
    between_rounds=None,
) -> Completion:
    """Complete ``prompt_text`` with speculative decoding, drafting from ``repo``'s history.

    The repository is indexed incrementally first. ``proposer="none"`` (or k=0) is
    plain decoding through the same loop. ``sampling`` is greedy by default;
    ``stop`` strings end the completion (excluded from it). Pass ``target``/``store``
    to reuse open ones: a kept Target also keeps its KV cache, so a second request
    on the same prefix evaluates only the new tokens. ``target_options`` go to
    :func:`open_target`. With ``guess_outside_git`` (``repo`` was inferred, not chosen)
    a directory outside git is drafted from only if ``assistd index`` took it before.
    ``proposer`` is a registered name (``suffix``, ``ngram``, ``draft_model`` with
    ``draft_model`` = the draft's GGUF, or a ``peer:...`` rule) or ``"none"``.

    ``k`` is the draft ceiling (tokens), or ``"auto"``: the tuner picks it per step for
    ``language`` (an LSP language id) from the persisted ledger. Either way the
    generation's counters are added to the ledger (one transaction) and its verify
    times to the Target's cost model. Pass ``tuner`` (an :class:`assistd.decoding.tuner.Tuner`)
    to reuse one; else one is opened on the store (calibrating t(n) once per Target).
    ``between_rounds`` goes to :func:`generate` (the daemon's preemption hook).
    """
    from proposers import make_proposer
    from proposers.index import HistoryIndex

    from assistd.decoding.tuner import K_MAX, Tuner, env_seed
    from storage.ledger_store import LedgerStore

    if max_tokens + 1 >= n_ctx:
        raise InputError(f"--max-tokens {max_tokens} does not fit --n-ctx {n_ctx}")
    auto = k == "auto"
    if not auto and (not isinstance(k, int) or k < 0):
        raise InputError(f"k must be 'auto' or a number of tokens >= 0, not {k!r}")
    speculate = proposer != "none" and (auto or k > 0)
    use_history = speculate and repo is not None
    if tuner is None or use_history:
        store = store or open_store(db)  # before the model: a bad --db fails fast
    target = target or open_target(model, n_ctx=n_ctx, **(target_options or {}))
    if tuner is None:
        # Exploration draws follow --seed too (a seeded sample is still only repeatable
        # for a fixed k: the ceiling the tuner picks changes as the ledger grows).
        seed = sampling.seed if sampling.seed is not None else env_seed()
        tuner = Tuner.open(LedgerStore(store), target, seed=seed)
    report = None
    history = {"scope": None, "documents": 0, "tokens": 0}
    hist_index = None
    if use_history:
        root = find_repository_root(repo)
        if guess_outside_git and not is_repository(root) and not store.has_scope(str(root)):
            # A file outside git whose directory nobody indexed: ~/scratch.py must not
            # pull ~/.netrc or ~/.env into the history. `assistd index DIR` or --repo opt in.
            use_history = False
    if use_history:
        # Outside git only the top directory, unless `assistd index` took the subtree.
        recursive = is_repository(root) or store.scope_recursive(str(root))
        report = index_repository(store, root, target.tokenize, target.fingerprint,
                                  recursive=recursive)
        store.mark_used(report.scope)  # eviction keeps the scopes completions use
        history = store.scope_summary(report.scope, target.fingerprint)
        hist_index = HistoryIndex(width=2 if target.n_vocab < 65535 else 4)
        hist_index.load(store, report.scope, target.fingerprint)

    budget = min(max_prompt_tokens, target.n_ctx - max_tokens - 1)
    # Tokenize only the tail that can fit (a token is rarely over 16 characters):
    # a multi-megabyte file before the cursor would otherwise take seconds.
    ids = target.tokenize(prompt_text[-budget * 16 :])
    ids = ids[-budget:] if len(ids) > budget else ids
    if (target.add_bos or not ids) and target.bos_token_id is not None and len(ids) < budget:
        ids = [target.bos_token_id] + ids
    if not ids:
        raise InputError("empty prompt and the model has no BOS token to start from")
    prop = None
    if speculate:
        # The proposer cuts its drafts with the Target's measured t(n); the tuner's
        # ceiling (k="auto") caps them per language from measured acceptance.
        options = proposer_options(proposer, hist_index, tuner.cost_model(), target)
        if proposer == "draft_model":
            from proposers.draft_model import open_draft

            if draft_model is None:
                raise InputError("--proposer draft_model needs --draft-model PATH (a GGUF of a"
                                 " smaller model with the Target's tokenizer)")
            try:
                options["draft"] = open_draft(draft_model, n_ctx=n_ctx)
            except ModelError as e:
                raise ModelError(f"--draft-model {draft_model}: {str(e).split(';')[0]}; pass a"
                                 " GGUF of a small model with the Target's tokenizer") from None
        try:
            prop = make_proposer(proposer, **options)
        except KeyError as e:
            raise InputError(str(e).strip('"')) from None
    name = proposer if prop else "none"
    ceiling = tuner.policy(name, language) if auto and prop else None
    scope = report.scope if report else None
    if scope is None and repo is not None and store is not None:
        # Plain decoding indexes nothing, but its steps belong to the repository's row.
        root = find_repository_root(repo)
        if is_repository(root) or store.has_scope(str(root)):
            scope = str(root)
    gen = generate(target, ids, prop, max_tokens=max_tokens,
                   k=(K_MAX if auto else k) if prop else 0, sampling=sampling, stop=stop,
                   scope=scope, language=language, ceiling=ceiling,
                   between_rounds=between_rounds)
    tuned = tuner.estimate(name, language).as_dict() if auto and prop else None
    tuner.record(scope, language, name, gen.ledger)
    return Completion(generation=gen, target=target, history=history, index=report,
                      proposer=name, k=k if prop else 0, sampling=sampling,
                      language=language, tuned=tuned)


def proposer_options(name: str, history, cost, target: Target | None = None) -> dict:
    """Constructor options of proposer ``name``: the ones ``complete`` and ``replay``
    both use, so that a replay measures what a completion runs.

    ``history`` (a :class:`proposers.index.HistoryIndex`), ``cost`` (the Target's
    :class:`assistd.ground.costmodel.CostModel`, or None) and ``target`` are offered to every
    proposer (each takes what its constructor names). ngram also gets alpha=0.5: a
    match of m tokens drafts at most ceil(m/2), because on llama.cpp on a CPU verifying
    k tokens costs ~k/2 plain steps and long drafts on weak matches lose time
    (benchmarks/copy_heavy.py: k=8 without the cap ran at 0.69-0.80x plain). With
    ``k="auto"`` the tuner then caps every draft per language (``assistd.decoding.tuner``).
    """
    options = {"history": history, "target": target, "cost": cost}
    if name == "ngram":
        options["alpha"] = 0.5
    return options


def ledger_line(c: Completion) -> str:
    line = c.generation.ledger.summary() + f" stop={c.generation.stop_reason}"
    if c.generation.speculation_off:
        line += f" speculation=off ({c.generation.speculation_off})"
    return line

