"""The workloads of ``assistd bench``: real text turned into prompts and histories.

A workload is a list of cases (a prompt in the Target's tokens, a language id) and the
history its proposers draft from: documents in the workload's scope from the start, plus
each case's ``seed`` documents, added just before the case (so a case never sees a
later case's history). The Target writes its own continuation of every prompt: the
text the workload was built from is never used as the answer.

- ``agent``: model calls reconstructed from transcripts. The last sessions' calls are
  the cases (each call's messages are the turns before it, in the Target's chat
  template, oldest dropped to fit); every earlier session of the same files is the
  history (one document per turn, as the daemon's ingest stores records). One aider
  history is split into its runs (``# aider chat started at``).
- ``edit``: a repository's git history. For a file a commit modified, the cursor is put
  after the first changed block whose following lines are unchanged; the prompt is the
  new version before the cursor; the old version (and those of the other files changed
  up to that commit) is the history: the Target continues into code the history holds.
- ``stdlib``: the Python standard library of this interpreter (or a folder of .py files):
  a cursor at a line start 30-80% into a file, the file before it as the prompt, every
  other file of the library as the history.
- ``rewrite``: real edits (git commits, agent transcripts' Edit and apply_patch calls),
  the text before each edit sent as the request's prediction
  (:mod:`assistd.measure.bench_rewrite`).
- ``novel``: prose requests (the first user message of each transcript session, or
  module docstrings when there are no transcripts) whose answer is in no history: the
  history is code (the standard library), which proposers may match but cannot predict
  from. Speculation must not cost time here.
"""

from __future__ import annotations

import difflib
import random
import re
import subprocess
import sysconfig
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from assistd.ground.errors import InputError
from assistd.measure.replay_inputs import (
    InputReport, Session, git_sessions, transcript_session, transcript_sessions,
)

NAMES = ("agent", "edit", "stdlib", "novel", "rewrite")
AIDER_RUN = re.compile(r"^# aider chat started at", re.M)
# Transcript kinds -> chat roles; anything else is a user message.
ROLE = {"user": "user", "tool_result": "user", "system": "system",
        "assistant": "assistant", "tool_input": "assistant"}
STDLIB_SKIP = {"test", "tests", "idle_test", "site-packages", "__pycache__"}
CASE_FILE_BYTES = (4_000, 200_000)  # stdlib: files this size can hold a case


@dataclass
class Case:
    """One prompt: ``prompt`` token ids; ``seed``: ``(name, tokens)`` documents added to
    the history just before it; ``language``: the LSP language id given to proposers
    and the tuner; ``prediction``: token ids sent as the request's predicted output
    (the ``rewrite`` workload), and ``kind`` its case kind there."""

    name: str
    prompt: list[int]
    language: str | None
    seed: list[tuple[str, np.ndarray]] = field(default_factory=list)
    prediction: list[int] | None = None
    kind: str | None = None


@dataclass
class Workload:
    """Cases plus the history documents present from the start (``(name, tokens)``)."""

    name: str
    source: str
    description: str
    cases: list[Case]
    history: list[tuple[str, np.ndarray]] = field(default_factory=list)

    @property
    def history_tokens(self) -> int:
        return sum(len(t) for _, t in self.history) + sum(
            len(t) for c in self.cases for _, t in c.seed)

    @property
    def history_documents(self) -> int:
        return len(self.history) + sum(len(c.seed) for c in self.cases)


# ---------------------------------------------------------------- agent calls


def aider_runs(text: str) -> list[str]:
    """An aider history split at its ``# aider chat started at`` lines (text before
    the first one, if any, is the first run)."""
    starts = [m.start() for m in AIDER_RUN.finditer(text)]
    if not starts or starts[0] != 0:
        starts = [0] + starts
    return [text[a:b] for a, b in zip(starts, starts[1:] + [len(text)]) if text[a:b].strip()]


def model_calls(session: Session) -> list[dict]:
    """``[{messages, reference}]``: one call per group of consecutive model turns, whose
    messages are the turns before it (consecutive turns of one role merged)."""
    calls, msgs, i, turns = [], [], 0, session.turns
    while i < len(turns):
        t = turns[i]
        if not t.is_model:
            role = ROLE.get(t.role, "user")
            if msgs and msgs[-1]["role"] == role:
                msgs[-1] = {"role": role, "content": msgs[-1]["content"] + "\n\n" + t.text}
            else:
                msgs.append({"role": role, "content": t.text})
            i += 1
            continue
        j = i
        while j < len(turns) and turns[j].is_model:
            j += 1
        reply = "\n\n".join(x.text for x in turns[i:j])
        if any(m["role"] != "system" and m["content"].strip() for m in msgs):
            calls.append({"messages": [dict(m) for m in msgs], "reference": reply})
        if msgs and msgs[-1]["role"] == "assistant":
            msgs[-1] = {"role": "assistant", "content": msgs[-1]["content"] + "\n\n" + reply}
        else:
            msgs.append({"role": "assistant", "content": reply})
        i = j
    return calls


def fit(target, messages: list[dict], budget: int) -> tuple[list[dict], int, int]:
    """``(messages, prompt tokens, messages dropped)``: the oldest non-system messages
    dropped until the rendered prompt has at most ``budget`` tokens; a message left
    alone over it (or a system message over half of it) keeps its last tokens."""
    from assistd.runtime.chat import chat_prompt_ids

    system = [m for m in messages[:1] if m["role"] == "system"]
    rest = messages[len(system):]

    def cut(m, keep):
        ids = target.tokenize(m["content"])
        return {**m, "content": target.detokenize(ids[-max(1, keep):]) if keep > 0 else ""}

    if system and len(target.tokenize(system[0]["content"])) > budget // 2:
        system = [cut(system[0], budget // 2)]
    sizes = [len(target.tokenize(m["content"])) + 4 for m in rest]  # + role and markers
    dropped = 0
    base = len(chat_prompt_ids(target, system + [{"role": "user", "content": ""}]))
    while len(rest) > 1 and base + sum(sizes) > budget:
        rest, sizes, dropped = rest[1:], sizes[1:], dropped + 1
    while True:
        n = len(chat_prompt_ids(target, system + rest))
        if n <= budget:
            return system + rest, n, dropped
        if len(rest) > 1:
            rest, dropped = rest[1:], dropped + 1
        else:
            rest = [cut(rest[0], len(target.tokenize(rest[0]["content"])) - (n - budget) - 2)]


def default_transcripts() -> list[Path]:
    """Where agents keep transcripts on this machine: aider's history in the current
    folder, Claude Code's and Codex CLI's session folders (those that exist)."""
    home = Path.home()
    found = [p for p in (Path.cwd() / ".aider.chat.history.md", home / ".claude" / "projects",
                         home / ".codex" / "sessions") if p.exists()]
    return found


def transcript_source(path: Path | None) -> list[Session]:
    """Sessions in order: one aider file is split into runs; anything else is read as
    ``assistd replay`` reads transcripts (a folder gives its transcript files, sorted).
    Raises :class:`InputError` when there is nothing to read."""
    paths = [Path(path)] if path is not None else default_transcripts()
    if not paths:
        raise InputError("no transcripts found (./.aider.chat.history.md, ~/.claude/projects,"
                         " ~/.codex/sessions); pass --workload agent=PATH")
    if len(paths) == 1 and paths[0].is_file():
        head = paths[0].read_bytes()[:65536]
        if AIDER_RUN.search(head.decode("utf-8", "replace")):
            runs = aider_runs(paths[0].read_text(encoding="utf-8", errors="replace"))
            out = []
            for i, run in enumerate(runs):
                s = _aider_session(run, f"{paths[0].name} run {i + 1}/{len(runs)}")
                out.append(s)
            return out
    return transcript_sessions(paths, InputReport())


def _aider_session(text: str, name: str) -> Session:
    """One aider run as a session (the parser reads files: a temporary one)."""
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".md", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        s = transcript_session(Path(f.name), "aider")
    s.name = name
    return s


def agent_workload(target, path: Path | None, n_cases: int, budget: int) -> Workload:
    """The last sessions' model calls as cases, every earlier session as history."""
    from assistd.runtime.chat import chat_prompt_ids

    sessions = transcript_source(path)
    picked: list[tuple[Session, dict]] = []
    first = len(sessions)
    while first > 0 and len(picked) < n_cases:
        first -= 1
        calls = model_calls(sessions[first])
        picked = [(sessions[first], c) for c in calls] + picked
    if not picked:
        where = path or ", ".join(map(str, default_transcripts()))
        raise InputError(f"agent: no model call found in {where}; pass --workload agent=PATH")
    picked = picked[-n_cases:]  # the last calls
    cases = []
    for n, (s, call) in enumerate(picked):
        messages, _, _ = fit(target, call["messages"], budget)
        cases.append(Case(f"{s.name} call {n + 1}", chat_prompt_ids(target, messages),
                          "markdown"))
    history = [(f"{s.name}#{i}", np.asarray(target.tokenize(t.text), dtype=np.int64))
               for s in sessions[:first] for i, t in enumerate(s.turns) if t.text.strip()]
    src = str(path) if path is not None else ", ".join(map(str, default_transcripts()))
    return Workload("agent", src, f"{len(cases)} model calls of the last sessions; "
                    f"{first} earlier sessions in the history", cases, history)


# ---------------------------------------------------------------- edit


def edit_cursor(old: str, new: str, min_after: int = 3) -> int | None:
    """Where to complete the new version of a file: the character offset of the first
    line after the first changed block that is followed by ``min_after`` unchanged lines
    (lines the old version holds), or None when no such block exists.

    >>> edit_cursor("a\\nb\\nc\\nd\\ne\\n", "a\\nB\\nc\\nd\\ne\\n")
    4
    """
    a, b = old.splitlines(keepends=True), new.splitlines(keepends=True)
    ops = difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes()
    for (tag, _, _, _, j2), nxt in zip(ops, ops[1:]):
        if tag != "equal" and nxt[0] == "equal" and nxt[4] - nxt[3] >= min_after:
            return sum(len(line) for line in b[:j2])
    return None


def window(target, text: str, budget: int) -> list[int]:
    """The last ``budget`` tokens of ``text`` (BOS first when the Target adds one), as
    ``assistd complete`` builds an editor prompt (only the tail is tokenized)."""
    ids = target.tokenize(text[-budget * 16:])
    ids = ids[-budget:] if len(ids) > budget else ids
    if (target.add_bos or not ids) and target.bos_token_id is not None and len(ids) < budget:
        ids = [target.bos_token_id] + ids
    return ids


def edit_workload(target, repo: Path | None, n_cases: int, budget: int) -> Workload:
    """One case per recent commit (newest first, at most ``n_cases``), replayed oldest
    first. Before a case the history holds every file version of the replayed commits
    as of the case's parent commit (the changed files' old versions, and the latest
    version of every file an earlier replayed commit touched)."""
    repo = Path(repo) if repo is not None else Path.cwd()
    if repo.is_dir() and (repo / ".git").exists() and subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "--verify", "-q", "HEAD"],
            capture_output=True).returncode != 0:
        raise InputError(f"edit: {repo} has no commits yet; pick a repository with history")
    sessions = git_sessions(repo, max(30, 4 * n_cases), InputReport())

    def path_of(s: Session) -> str:
        return s.turns[0].text.rstrip("\n")

    def commit_of(s: Session) -> str:
        return s.name.split(":", 1)[0]

    # Pass 1: each session's old version (its seed, or the path's last replayed version).
    old: dict[int, str] = {}
    state: dict[str, str] = {}
    for i, s in enumerate(sessions):
        for _, text in s.seed:
            state[path_of(s)] = text
        if path_of(s) in state:
            old[i] = state[path_of(s)]
        if i + 1 == len(sessions) or commit_of(sessions[i + 1]) != commit_of(s):
            for j in range(i, -1, -1):  # the commit is done: its new versions are current
                if commit_of(sessions[j]) != commit_of(s):
                    break
                state[path_of(sessions[j])] = sessions[j].turns[1].text
    chosen: dict[int, int] = {}
    commits: set[str] = set()
    for i in range(len(sessions) - 1, -1, -1):
        if len(chosen) >= n_cases or commit_of(sessions[i]) in commits or i not in old:
            continue
        cursor = edit_cursor(old[i], sessions[i].turns[1].text)
        if cursor is not None and cursor > 200:
            chosen[i] = cursor
            commits.add(commit_of(sessions[i]))
    if not chosen:
        raise InputError(f"edit: no commit of {repo} modifies a file with unchanged lines "
                         "after the change; pick a repository with more history")
    # Pass 2: walk again, putting each version in the history once, before the cases
    # that may see it.
    cases: list[Case] = []
    state, seen = {}, set()
    pending: list[tuple[str, np.ndarray]] = []
    for i, s in enumerate(sessions):
        for _, text in s.seed:
            state[path_of(s)] = text
        if i in chosen:
            for path, text in state.items():
                key = (path, hash(text))
                if key not in seen:
                    seen.add(key)
                    pending.append((path, np.asarray(target.tokenize(text), dtype=np.int64)))
            new = s.turns[1].text
            cases.append(Case(s.name, window(target, new[:chosen[i]], budget),
                              s.turns[1].language, pending))
            pending = []
        if i + 1 == len(sessions) or commit_of(sessions[i + 1]) != commit_of(s):
            for j in range(i, -1, -1):
                if commit_of(sessions[j]) != commit_of(s):
                    break
                state[path_of(sessions[j])] = sessions[j].turns[1].text
    head = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short=12", "HEAD"],
                          capture_output=True, text=True).stdout.strip()
    return Workload("edit", f"{repo} at {head}", f"{len(cases)} commits: the new version of a changed "
                    "file completed after its first change, old versions in the history", cases)


# ---------------------------------------------------------------- stdlib and novel


def library_files(root: Path | None) -> tuple[Path, list[Path]]:
    """The .py files of ``root`` (default: this interpreter's standard library), tests
    and site-packages left out, sorted."""
    root = Path(root) if root is not None else Path(sysconfig.get_paths()["stdlib"])
    if not root.is_dir():
        raise InputError(f"stdlib: not a folder: {root}")
    files = sorted(p for p in root.rglob("*.py")
                   if not STDLIB_SKIP.intersection(p.relative_to(root).parts[:-1]) and p.is_file()
                   and _is_text(p))
    if not files:
        raise InputError(f"stdlib: no .py text file under {root}")
    return root, files


def _is_text(path: Path) -> bool:
    """Not binary: no NUL in the first 8 KiB (as ``assistd index`` decides)."""
    try:
        with open(path, "rb") as f:
            return b"\0" not in f.read(8192)
    except OSError:
        return False


_TOKENIZED: dict[tuple[str, str], list[tuple[str, np.ndarray]]] = {}


def _library_docs(target, root: Path, files: list[Path]) -> list[tuple[str, np.ndarray]]:
    """Every file tokenized once per run (stdlib and novel share it: ~4M tokens, ~8 s)."""
    key = (getattr(target, "fingerprint", ""), str(root))
    if key not in _TOKENIZED:
        _TOKENIZED[key] = [(str(p.relative_to(root)), np.asarray(
            target.tokenize(p.read_text(encoding="utf-8", errors="replace")), dtype=np.int64))
            for p in files]
    return _TOKENIZED[key]


def stdlib_workload(target, root: Path | None, n_cases: int, budget: int,
                    seed: int = 0) -> Workload:
    """Cases in ``n_cases`` files drawn with ``seed``; every other file is history."""
    root, files = library_files(root)
    sized = [p for p in files if CASE_FILE_BYTES[0] <= p.stat().st_size <= CASE_FILE_BYTES[1]]
    rng = random.Random(seed)
    picked = rng.sample(sized or files, min(n_cases, len(sized or files)))
    cases = []
    for p in picked:
        text = p.read_text(encoding="utf-8", errors="replace")
        starts = [m.end() for m in re.finditer(r"\n(?=[ \t]*\S)", text)]
        inside = [s for s in starts if 0.3 * len(text) <= s <= 0.8 * len(text)] or starts or [0]
        cursor = rng.choice(inside)
        cases.append(Case(f"{p.relative_to(root)}:{text.count(chr(10), 0, cursor) + 1}",
                          window(target, text[:cursor], budget), "python"))
    names = {c.name.rsplit(":", 1)[0] for c in cases}
    history = [d for d in _library_docs(target, root, files) if d[0] not in names]
    return Workload("stdlib", str(root), f"{len(cases)} cursors inside library files; "
                    f"the other {len(history)} files in the history", cases, history)


def novel_workload(target, path: Path | None, n_cases: int, budget: int,
                   library: Path | None = None) -> Workload:
    """Prose requests as chat prompts, with code (the library) as the history."""
    from assistd.runtime.chat import chat_prompt_ids

    requests: list[str] = []
    try:
        for s in transcript_source(path):
            first = next((t.text for t in s.turns if t.role == "user"
                          and 40 <= len(t.text.strip()) <= 4000), None)
            if first and first.strip() not in requests:
                requests.append(first.strip())
        source = (f"first user messages of the transcripts in {path}" if path
                  else "first user messages of the agent transcripts")
    except InputError:
        if path is not None:
            raise
    root, files = library_files(library)
    if not requests:  # no transcripts, or none with a usable first request
        source = f"module docstrings of the library {root}"
        for p in files:
            m = re.match(r'\s*(?:#.*\n)*\s*[rRuU]?"""(.{80,1200}?)"""', p.read_text(
                encoding="utf-8", errors="replace"), re.S)
            if m:
                requests.append("Explain in plain words what this Python module does and "
                                "when to use it:\n\n" + m.group(1).strip())
            if len(requests) >= 4 * n_cases:
                break
    # Spread over the sources: every len/n-th request.
    step = max(1, len(requests) // max(1, n_cases))
    picked = requests[::step][:n_cases]
    cases = [Case(f"request {i + 1}", chat_prompt_ids(target, fit(
        target, [{"role": "user", "content": r}], budget)[0]), "markdown")
        for i, r in enumerate(picked)]
    if not cases:
        raise InputError("novel: no prose request found")
    return Workload("novel", source, f"{len(cases)} prose requests; the history is code "
                    f"({root}), which holds none of the answers", cases,
                    list(_library_docs(target, root, files)))


# ---------------------------------------------------------------- specs


def parse_spec(spec: str) -> tuple[str, Path | None]:
    """``NAME``, ``NAME=PATH`` or a bare ``PATH`` -> ``(name, path)``. A bare path is a
    git repository (``edit``), a folder of .py files without git (``stdlib``), or
    transcripts (``agent``). Raises :class:`InputError`."""
    name, sep, rest = spec.partition("=")
    if sep and name in NAMES:
        if not rest.strip():  # Path("") is ".": never bench the current folder unasked
            raise InputError(f"--workload {spec}: no path after '='; write {name}=PATH "
                             f"or just {name}")
        path = Path(rest).expanduser()
        if not path.exists():
            raise InputError(f"--workload {spec}: {path} does not exist")
        return name, path
    if spec in NAMES:
        return spec, None
    path = Path(spec).expanduser()
    if not path.exists():
        raise InputError(f"--workload {spec!r}: neither a workload ({', '.join(NAMES)}) "
                         "nor an existing path")
    if (path / ".git").exists():
        return "edit", path
    if path.is_dir() and next(path.glob("*.py"), None) is not None:
        return "stdlib", path
    return "agent", path


def build_workload(target, spec: str, *, cases: int, budget: int, seed: int = 0) -> Workload:
    """The workload ``spec`` names (see :func:`parse_spec`). Raises :class:`InputError`."""
    name, path = parse_spec(spec)
    builders: dict[str, Callable[[], Workload]] = {
        "agent": lambda: agent_workload(target, path, cases, budget),
        "edit": lambda: edit_workload(target, path, cases, budget),
        "stdlib": lambda: stdlib_workload(target, path, cases, budget, seed),
        "novel": lambda: novel_workload(target, path, cases, budget),
        "rewrite": lambda: rewrite_workload(target, path, cases, budget),
    }
    return builders[name]()


def rewrite_workload(target, path: Path | None, n_cases: int, budget: int) -> Workload:
    """``rewrite``: cases from the git repository ``path`` (default: the current
    directory) or from transcripts (``path`` a file or a folder of ``.jsonl``), two per
    edit (``file`` and ``prediction``: :mod:`assistd.measure.bench_rewrite`), at most
    ``n_cases`` edits; the history is empty (the edit's text is in the request). Raises
    :class:`InputError` when no edit fits ``budget`` prompt tokens."""
    from assistd.measure.bench_rewrite import (MAX_CASE_CHARS, OPEN_ANSWER, WINDOW_LINES,
                                               continuation_split, file_messages)
    from assistd.measure.rewrite_cases import git_cases
    from assistd.measure.rewrite_transcripts import transcript_cases
    from assistd.runtime.chat import chat_prompt_ids

    source = Path(path) if path is not None else Path.cwd()
    options = {"limit": n_cases, "window": WINDOW_LINES, "max_chars": MAX_CASE_CHARS}
    if (source / ".git").exists():
        try:
            edits = git_cases(source, **options)
        except subprocess.CalledProcessError as e:
            raise InputError(f"rewrite: git failed in {source}: {e}") from None
    else:
        files = sorted(source.rglob("*.jsonl")) if source.is_dir() else [source]
        edits = transcript_cases(files, **options)
    cases = []
    for e in edits:
        pred = target.tokenize(e.before)
        prompt = (chat_prompt_ids(target, file_messages(e.path, e.instruction, e.before))
                  + target.tokenize(OPEN_ANSWER))
        if len(prompt) <= budget and len(pred) < target.n_ctx // 2:
            cases.append(Case(f"file:{e.name}", prompt, e.language, prediction=pred,
                              kind="file"))
        split = continuation_split(e.before, e.after)
        if split is not None:
            ids = target.tokenize(split[0])
            if target.add_bos and target.bos_token_id is not None:
                ids = [target.bos_token_id] + ids
            if 0 < len(ids) <= budget:
                cases.append(Case(f"prediction:{e.name}", ids, e.language,
                                  prediction=target.tokenize(split[1]), kind="prediction"))
    if not cases:
        raise InputError(f"rewrite: no edit found in {source} that fits; pass rewrite=PATH"
                         " (a git repository with history, or agent transcripts)")
    return Workload("rewrite", str(source), f"{len(edits)} real edits, two cases each: the"
                    " file in the prompt (chat) and only in the prediction (completion)", cases)
