"""`assistd` end to end, as a subprocess, on the real embedded model and a real SQLite file."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from harness.texts import COPY_HEAVY
from tests.conftest import make_repo, on_remote_target

REPO = Path(__file__).resolve().parents[1]


def assistd(*args, input=None, db=None, cwd=None):
    env = dict(os.environ)
    if db is not None:
        env["ASSISTD_DB"] = str(db)
    return subprocess.run(
        [sys.executable, "-m", "assistd", *map(str, args)], capture_output=True, text=True,
        input=input, env=env, cwd=cwd, timeout=300,
    )


@pytest.fixture
def repo(tmp_path):
    return make_repo(tmp_path / "proj", {
        "users.py": COPY_HEAVY + "        rows = [line.rstrip(\"\\n\").split(\",\") for line in f]\n",
        "README.md": "# proj\n",
        ".gitignore": "*.secret\n",
        "token.secret": "sk-not-for-history\n",
    })


@pytest.mark.local_target("the second run drafts from the history: local draft verification (the ledger's rounds)")
def test_complete_json_then_second_run_served_from_history(repo, tmp_path):
    """`complete --json` indexes the repository (3 documents, not the secret file), drafts from
    it with ngram and reports the Target (fast numerics, batch-argmax promise), the history and
    a ledger whose rates follow from its counters; a second run re-tokenizes nothing."""
    db = tmp_path / "h.db"
    f = repo / "users.py"
    # ngram with a forced k: whether suffix drafts depends on the t(n) calibrated at
    # start, which a busy machine changes (seen in CI beside a benchmark).
    first = assistd("complete", "--file", f, "--line", 15, "--column", 1, "--json",
                    "--proposer", "ngram", "--k", "8", db=db)
    assert first.returncode == 0, first.stderr
    out = json.loads(first.stdout)
    assert isinstance(out["completion"], str) and out["completion"]
    assert out["tokens"] == out["ledger"]["committed_tokens"] > 0
    assert out["target"]["backend"] == "llama"
    assert out["target"]["model"].endswith("SmolLM2-135M-Instruct.Q4_1.gguf")
    assert out["target"]["n_ctx"] == 4096  # (assistd.ground.options.DEFAULT_N_CTX)
    # the default numerics, and what its speculative output promises
    assert (out["target"]["numerics"], out["target"]["promise"]) == ("fast", "batch-argmax")
    assert out["history"]["scope"] == str(repo.resolve())
    assert out["history"]["documents"] == 3  # users.py, README.md, .gitignore; not token.secret
    assert out["history"]["tokens"] > 100
    led = out["ledger"]
    for key in ("draft_tokens", "accepted_tokens", "rounds", "plain_steps", "acceptance_rate",
                "mean_acceptance_length", "coverage", "draft_ms", "verify_ms", "total_ms",
                "tokens_per_s"):
        assert key in led
    assert led["accepted_tokens"] <= led["draft_tokens"]
    assert out["tokens"] == led["accepted_tokens"] + led["rounds"] + led["plain_steps"]
    assert led["rounds"] > 0 and led["mean_acceptance_length"] > 1
    assert led["acceptance_rate"] == pytest.approx(led["accepted_tokens"] / led["draft_tokens"])
    assert led["coverage"] == pytest.approx(led["rounds"] / (led["rounds"] + led["plain_steps"]))
    assert out["index"]["tokenized"] == 3

    second = json.loads(assistd("complete", "--file", f, "--line", 15, "--json", db=db).stdout)
    assert second["index"]["tokenized"] == 0 and second["index"]["unchanged"] == 3
    assert second["history"] == out["history"]


def test_plain_mode_prints_completion_and_one_ledger_line(repo, tmp_path):
    """Without --json, complete prints the completion on stdout and one stats line on stderr
    (acceptance rate and coverage; a remote Target's own figures)."""
    r = assistd("complete", "--file", repo / "users.py", "--line", 15, "--max-tokens", 8,
                db=tmp_path / "h.db")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip()
    lines = r.stderr.strip().splitlines()
    if on_remote_target():  # the server's figures, never an acceptance it did not measure
        assert len(lines) == 1 and "target=remote tokens=8" in lines[0]
    else:
        assert len(lines) == 1 and "acceptance_rate=" in lines[0] and "coverage=" in lines[0]


@pytest.mark.local_target("plain steps and null ratios of local decoding rounds")
def test_no_speculation_is_plain_decoding_with_null_ratios(repo, tmp_path):
    """--no-speculation decodes plainly: 8 plain steps, no rounds, null acceptance rate and
    length, coverage 0."""
    r = assistd("complete", "--file", repo / "users.py", "--no-speculation", "--max-tokens", 8,
                "--json", db=tmp_path / "h.db")
    led = json.loads(r.stdout)["ledger"]
    assert led["rounds"] == 0 and led["plain_steps"] == 8
    assert led["acceptance_rate"] is None and led["mean_acceptance_length"] is None
    assert led["coverage"] == 0.0


def test_stdin_prompt(tmp_path):
    """--file - reads the prompt from stdin and completes the requested 5 tokens."""
    r = assistd("complete", "--file", "-", "--max-tokens", 5, "--json", input="def fib(n):\n",
                db=tmp_path / "h.db", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["tokens"] == 5


def test_index_command_reports_counts(repo, tmp_path):
    """`assistd index --json` reports 3 documents tokenized and the binary file skipped; a
    second run tokenizes nothing."""
    (repo / "logo.png").write_bytes(b"\x89PNG\0\0binary")
    r = assistd("index", repo, "--json", db=tmp_path / "h.db")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["documents"] == 3 and rep["skipped_binary"] == 1 and rep["tokenized"] == 3
    again = json.loads(assistd("index", repo, "--json", db=tmp_path / "h.db").stdout)
    assert again["tokenized"] == 0


def one_line_error(r, *needles):
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    for n in needles:
        assert n in lines[0], lines[0]


def test_missing_model_is_one_line_exit_2(repo, tmp_path):
    """A --model that does not exist exits 2 with one line naming the file and --model."""
    missing = tmp_path / "nope.gguf"
    r = assistd("complete", "--file", repo / "users.py", "--model", missing, db=tmp_path / "h.db")
    one_line_error(r, "model file not found", str(missing), "--model")


def test_non_gguf_and_truncated_model_are_one_line_exit_2(repo, tmp_path):
    """A file that is not GGUF, and a truncated GGUF, each exit 2 with one line naming the
    file."""
    from assistd.targets.open import default_model_path

    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a model at all")
    one_line_error(assistd("complete", "--file", repo / "users.py", "--model", junk),
                   "not a GGUF model file", str(junk))
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(default_model_path().read_bytes()[: 2_000_000])
    one_line_error(assistd("complete", "--file", repo / "users.py", "--model", cut),
                   "failed to load model", str(cut))


def test_unreadable_inputs_and_positions_are_one_line_exit_2(repo, tmp_path):
    """A missing file, a folder, a line or column past the end and a binary file each exit 2
    with one line saying which."""
    f = repo / "users.py"
    one_line_error(assistd("complete", "--file", tmp_path / "missing.py"), "file not found")
    one_line_error(assistd("complete", "--file", repo), "not a file")
    one_line_error(assistd("complete", "--file", f, "--line", 999), "line 999 is past the end")
    one_line_error(assistd("complete", "--file", f, "--line", 1, "--column", 500),
                   "column 500 is past the end of line 1")
    binary = repo / "blob.bin"
    binary.write_bytes(b"\0\1\2")
    one_line_error(assistd("complete", "--file", binary), "looks binary")
    # from stdin it names stdin, not "-" (a newcomer read "error: - looks binary")
    one_line_error(assistd("complete", "--file", "-", input="a\0b"), "stdin looks binary")


def test_a_fifo_or_a_device_as_file_is_refused_at_once(repo):
    """A FIFO hung `assistd complete` forever, and a link to /dev/zero read until the
    kernel killed it (issue 21, a break-it pass): refused before reading, exit 2."""
    fifo = repo / "pipe.py"
    os.mkfifo(fifo)
    zero = repo / "zero.py"
    zero.symlink_to("/dev/zero")
    for f in (fifo, zero, "/dev/zero"):
        one_line_error(assistd("complete", "--file", f, "--no-daemon"), "not a regular file")


def test_every_command_has_help_with_an_example():
    """Every command and subcommand answers --help with an Example."""
    from click.testing import CliRunner

    from assistd.cli import cli

    runner = CliRunner()
    for path, _ in [([], cli), *_commands(cli)]:
        res = runner.invoke(cli, [*path, "--help"])
        assert res.exit_code == 0
        assert "Example" in res.output, f"`assistd {' '.join(path)} --help` lacks an example"


def _commands(group, prefix=()):
    """(path, command) for every command and subcommand, groups included."""
    import click

    for name, cmd in group.commands.items():
        yield [*prefix, name], cmd
        if isinstance(cmd, click.Group):
            yield from _commands(cmd, (*prefix, name))


@pytest.mark.parametrize("marker", ["test-command", "e2e-command"])
def test_readme_test_command_is_what_ci_runs(marker):
    """README's test command and its e2e command: CI runs both, the e2e one after."""
    readme = (REPO / "README.md").read_text()
    ci = (REPO / ".ci/run").read_text()
    start = readme.index(f"<!-- {marker} -->")
    block = readme[start:].split("```", 2)[1]
    command = block.strip().splitlines()[-1].strip()
    # .ci/run has run ./install.sh dev once already: the rest of the line must follow.
    rest = command.removeprefix("./install.sh dev && ") if marker == "e2e-command" else command
    assert rest in ci, f"README's {marker} {command!r} is not in .ci/run"
    if marker == "e2e-command":
        assert ci.index(rest) > ci.index(".venv/bin/python -m pytest\n")


def test_cli_guide_documents_every_cli_option():
    """The CLI guide (docs/cli.md, hand-written) drifts from --help: fail when an option
    is missing there. (The generated reference is checked in tests/test_docs.py.)"""
    from assistd.cli import cli

    guide = (REPO / "docs" / "cli.md").read_text()
    for path, cmd in _commands(cli):
        name = " ".join(path)
        if len(path) == 1:
            assert f"assistd {name}" in guide
        else:  # `assistd history stats|sources` documents two subcommands on one line
            assert f"assistd {path[0]}" in guide and path[-1] in guide, name
        for param in cmd.params:
            for opt in param.opts:
                if opt.startswith("--") and opt != "--help":
                    assert opt in guide, f"docs/cli.md lacks `assistd {name} {opt}`"


@pytest.mark.local_target("llama.cpp's context padding of the local Target (64 -> 256)")
def test_small_n_ctx_with_long_prompt(repo, tmp_path):
    """--n-ctx below llama.cpp's padding (64 -> 256) and a long file: runs, no abort."""
    long_file = repo / "long.py"
    long_file.write_text(COPY_HEAVY * 20)
    r = assistd("complete", "--file", long_file, "--n-ctx", 64, "--max-tokens", 16, "--json",
                db=tmp_path / "h.db")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["tokens"] == 16
    assert out["target"]["n_ctx"] == 256
    assert out["ledger"]["prompt_tokens"] + 16 < 256


@pytest.mark.local_target("a scope indexed for drafting; nothing drafts against a remote Target")
def test_index_then_complete_outside_git_keep_the_subtree(tmp_path):
    """`index DIR` takes subdirectories; a later `complete` there must not forget them."""
    loose = tmp_path / "loose"
    (loose / "sub").mkdir(parents=True)
    (loose / "sub" / "x.py").write_text("def x():\n    return 1\n")
    (loose / "top.py").write_text("def top():\n    return 2\n")
    db = tmp_path / "h.db"
    first = json.loads(assistd("index", loose, "--json", db=db).stdout)
    assert first["documents"] == 2
    r = assistd("complete", "--file", loose / "top.py", "--max-tokens", 4, "--json", db=db)
    out = json.loads(r.stdout)
    assert out["index"]["removed"] == 0 and out["history"]["documents"] == 2


def test_stdin_outside_git_uses_no_history(tmp_path):
    """A stdin prompt outside a git repository uses no history scope and indexes nothing (not
    the folder's .secrets)."""
    (tmp_path / ".secrets").write_text("API_KEY=sk-123\n")
    r = assistd("complete", "--file", "-", "--max-tokens", 3, "--json", input="x = 1\n",
                db=tmp_path / "h.db", cwd=tmp_path)
    out = json.loads(r.stdout)
    assert out["history"]["scope"] is None and out["index"] is None


def test_foreign_database_is_one_line_exit_2(repo, tmp_path):
    """A --db written by another program exits 2 with one line: not an assistd history
    database."""
    import sqlite3

    other = tmp_path / "other.db"
    with sqlite3.connect(other) as c:
        c.execute("create table documents (title text)")
    one_line_error(assistd("complete", "--file", repo / "users.py", "--db", other),
                   "not an assistd history database")


def test_complete_sampling_is_seeded_and_stop_string_is_excluded(repo, tmp_path):
    """Sampling with a seed gives the same completion in two runs and reports its settings;
    greedy reports temperature 0; a --stop string ends the completion before it (stop_reason
    stop)."""
    db = tmp_path / "h.db"
    f = repo / "users.py"
    args = ("complete", "--file", f, "--line", 15, "--column", 1, "--max-tokens", 24,
            "--temperature", 0.8, "--top-k", 20, "--top-p", 0.95, "--seed", 7, "--json")
    a, b = assistd(*args, db=db), assistd(*args, db=db)
    assert a.returncode == 0 and b.returncode == 0, a.stderr + b.stderr
    ja, jb = json.loads(a.stdout), json.loads(b.stdout)
    assert ja["completion"] == jb["completion"]
    assert ja["sampling"] == {"temperature": 0.8, "top_k": 20, "top_p": 0.95,
                              "repetition_penalty": 1.0, "seed": 7}
    greedy = json.loads(assistd("complete", "--file", f, "--line", 15, "--column", 1,
                                "--max-tokens", 24, "--json", db=db).stdout)
    assert greedy["sampling"] == {"temperature": 0.0}
    text = greedy["completion"]
    stop = text.strip().split()[1]  # a word the greedy completion will produce
    cut = assistd("complete", "--file", f, "--line", 15, "--column", 1, "--max-tokens", 24,
                  "--stop", stop, "--json", db=db)
    jc = json.loads(cut.stdout)
    assert jc["stop_reason"] == "stop"
    assert jc["completion"] == text[: text.index(stop)]


@pytest.mark.parametrize("bad", [("--top-p", "0"), ("--temperature", "-1"), ("--backend", "tf")])
def test_complete_rejects_bad_sampling_and_backend_options(repo, bad):
    """--top-p 0, --temperature -1 and an unknown --backend exit 2 naming the option, no
    traceback."""
    r = assistd("complete", "--file", repo / "users.py", *bad)
    assert r.returncode == 2
    assert bad[0] in r.stderr and "Traceback" not in r.stderr


@pytest.mark.local_target("the torch backend")
def test_complete_on_the_torch_backend_shares_the_history(repo, tmp_path):
    """--backend torch: same tokenizer fingerprint, so the llama-built history drafts for it."""
    pytest.importorskip("torch", reason="the torch backend needs assistd[torch]")
    db = tmp_path / "h.db"
    f = repo / "users.py"
    assert assistd("index", repo, db=db).returncode == 0  # built with the llama tokenizer
    # A fixed ceiling: under --k auto a fresh tuner calibrates t(n) by the wall clock, and
    # on a loaded machine (a full test run on 2 cores) it measured drafting as not paying.
    r = assistd("complete", "--file", f, "--line", 15, "--column", 1, "--k", "8",
                "--backend", "torch", "--device", "cpu", "--json", db=db)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["target"]["backend"] == "torch" and out["target"]["device"] == "cpu"
    assert out["index"]["unchanged"] == 3 and out["index"]["tokenized"] == 0
    assert out["history"]["tokens"] > 100
    assert out["ledger"]["rounds"] > 0 and out["completion"]


@pytest.mark.parametrize("bad", [("--temperature", "nan"), ("--top-p", "nan"),
                                 ("--repeat-penalty", "nan"), ("--seed", "-1")])
def test_nan_and_negative_seed_are_usage_errors(repo, bad):
    """NaN temperature, top-p or repeat penalty, and a negative seed, exit 2 without
    traceback."""
    r = assistd("complete", "--file", repo / "users.py", "--temperature", "0.8", *bad)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr


@pytest.mark.local_target("--repo indexes a scope for drafting; nothing drafts against a remote Target")
def test_file_outside_git_does_not_pull_its_dotfiles_into_the_history(tmp_path):
    """A file outside a repository has no history scope; --repo on its folder indexes the file
    but never a credential file such as .netrc."""
    home = tmp_path / "fakehome"
    home.mkdir()
    (home / ".netrc").write_text("machine x password SECRET\n")
    (home / "scratch.py").write_text("print(1)\n")
    db = tmp_path / "h.db"
    r = assistd("complete", "--file", home / "scratch.py", "--max-tokens", 3, "--json", db=db)
    out = json.loads(r.stdout)
    assert out["history"]["scope"] is None and out["index"] is None
    # Opting in with --repo indexes it, but never a credential file such as .netrc.
    r = assistd("complete", "--file", home / "scratch.py", "--repo", home, "--max-tokens", 3,
                "--json", db=db)
    assert json.loads(r.stdout)["history"]["documents"] == 1
    with sqlite3.connect(db) as c:
        assert c.execute("select path from documents").fetchall() == [("scratch.py",)]


@pytest.mark.local_target("the proposer of local drafting (a remote Target's plan is 'remote')")
def test_proposer_choice_and_draft_model_needs_its_model(repo, tmp_path):
    """suffix is the default and says so; ngram is chosen by name; draft_model without
    --draft-model is a one-line usage error naming the option."""
    db, f = tmp_path / "h.db", repo / "users.py"
    out = json.loads(assistd("complete", "--file", f, "--max-tokens", 8, "--json", db=db).stdout)
    assert out["proposer"] == "suffix"
    out = json.loads(assistd("complete", "--file", f, "--max-tokens", 8, "--proposer", "ngram",
                             "--json", db=db).stdout)
    assert out["proposer"] == "ngram"
    r = assistd("complete", "--file", f, "--proposer", "draft_model", db=db)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--draft-model" in r.stderr


@pytest.mark.local_target("a draft model drafts for a local Target only")
def test_draft_model_option_implies_the_proposer_and_names_itself_on_a_bad_file(repo, tmp_path):
    """--draft-model alone drafts with it (seen ignored in a newcomer's run); a file that is
    not a GGUF is a one-line error naming --draft-model, not --model."""
    r = assistd("complete", "--file", repo / "users.py", "--draft-model", repo / "README.md",
                db=tmp_path / "h.db")
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert r.stderr.startswith("error: --draft-model ") and "--model PATH" not in r.stderr


# -- the remote Target's options (issue 25) ----------------------------------------------


def _run(*args, env=None, cwd=None):
    """``assistd ARGS`` with ``env`` over this environment less its Target variables
    (``--target remote`` sets them): the test's own flags, files or ``env`` say it."""
    base = {k: v for k, v in os.environ.items()
            if k != "ASSISTD_BACKEND" and not k.startswith("ASSISTD_TARGET_")}
    return subprocess.run([sys.executable, "-m", "assistd", *map(str, args)], capture_output=True,
                          text=True, env={**base, **(env or {})}, cwd=cwd, timeout=120)


def test_a_bad_target_fim_names_the_flag_or_the_file_it_came_from(tmp_path):
    """`--target-fim nope` said `target_fim must be ...` (the config key) and a config
    file's bad value did not say which file: now a flag's error names the flag, a
    file's the file and the key, a variable's the variable."""
    url = "http://127.0.0.1:9"
    f = tmp_path / "c.toml"
    f.write_text(f'backend = "openai"\ntarget_url = "{url}"\n')
    r = _run("serve", "--config", f, "--target-fim", "nope", "--print-config")
    assert r.returncode == 2 and "'--target-fim'" in r.stderr and "not 'nope'" in r.stderr
    r = _run("complete", "--file", "-", "--backend", "openai", "--target-url", url,
             "--target-fim", "nope", cwd=tmp_path)
    assert r.returncode == 2 and "'--target-fim'" in r.stderr and "target_fim" not in r.stderr
    f.write_text(f'backend = "openai"\ntarget_url = "{url}"\ntarget_fim = "nope"\n')
    r = _run("serve", "--config", f, "--print-config")
    one_line_error(r, f"config file {f}: target_fim must be one of auto, none", "not 'nope'")
    f.write_text('backend = "openai"\ntarget_url = "ftp://x"\n')
    r = _run("serve", "--config", f, "--print-config")
    one_line_error(r, f"config file {f}: target_url 'ftp://x' must be http(s)://")
    r = _run("serve", "--print-config", env={"ASSISTD_TARGET_FIM": "nope",
                                            "ASSISTD_BACKEND": "openai",
                                            "ASSISTD_TARGET_URL": url})
    one_line_error(r, "$ASSISTD_TARGET_FIM: target_fim must be one of")


def test_print_config_says_whether_the_target_key_is_set_never_the_key(tmp_path):
    """`serve --print-config` says whether ASSISTD_TARGET_KEY is set (and unused when a key file
    is given) but never prints the key."""
    secret = "sk-print-config-7e1f0a"
    r = _run("serve", "--print-config", env={"ASSISTD_TARGET_KEY": secret})
    assert r.returncode == 0, r.stderr
    assert "# $ASSISTD_TARGET_KEY: set;" in r.stdout
    assert secret not in r.stdout and secret not in r.stderr
    r = _run("serve", "--print-config", "--target-key-file", tmp_path / "k",
             env={"ASSISTD_TARGET_KEY": secret})
    assert "$ASSISTD_TARGET_KEY: set (unused: target_key_file is read instead)" in r.stdout
    assert secret not in r.stdout
    r = _run("serve", "--print-config")  # (the variable is not passed on)
    assert r.returncode == 0 and "# $ASSISTD_TARGET_KEY: not set;" in r.stdout


@pytest.mark.parametrize("how", ["flags", "environment", "proposer"])
def test_a_draft_model_with_the_remote_target_is_refused(repo, how):
    """`--draft-model` with `--backend openai` was dropped without a word (the server
    decodes; nothing verifies a draft here): now a usage error, before anything loads
    or any server is asked (none answers on this URL)."""
    from assistd.targets.open import default_model_path

    remote = ["--backend", "openai", "--target-url", "http://127.0.0.1:9"]
    args = ["complete", "--file", repo / "users.py", "--no-daemon"]
    env = None
    if how == "flags":
        args += [*remote, "--draft-model", default_model_path()]
    elif how == "environment":  # the backend from the variables `serve` reads too
        args += ["--draft-model", default_model_path()]
        env = {"ASSISTD_BACKEND": "openai", "ASSISTD_TARGET_URL": "http://127.0.0.1:9"}
    else:
        args += [*remote, "--proposer", "draft_model"]
    r = _run(*args, env=env)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    flag = "--proposer draft_model" if how == "proposer" else "--draft-model"
    assert f"{flag} does not work with --backend openai" in r.stderr
    assert "verifies no drafts" in r.stderr


# -- numerics (assistd.ground.numerics) ------------------------------------------------------


def test_a_bad_numerics_names_the_flag_the_file_or_the_variable(tmp_path):
    """Each front end's --numerics takes fast, exact or llama, and says so naming itself;
    the config file's and the variable's errors name the file or the variable."""
    for command in (["complete", "--file", "-"], ["serve", "--print-config"],
                    ["mcp", "--no-daemon"], ["bench"]):
        r = _run(*command, "--numerics", "bogus", cwd=tmp_path)
        assert r.returncode == 2 and "Traceback" not in r.stderr, (command, r.stderr)
        assert "'--numerics'" in r.stderr and "'bogus'" in r.stderr, (command, r.stderr)
        assert "'fast', 'exact', 'llama'" in r.stderr, (command, r.stderr)
    f = tmp_path / "c.toml"
    f.write_text('numerics = "slow"\n')
    one_line_error(_run("serve", "--config", f, "--print-config"),
                   f"config file {f}: numerics must be 'fast', 'exact' or 'llama', not 'slow'")
    one_line_error(_run("serve", "--print-config", env={"ASSISTD_NUMERICS": "slow"}),
                   "$ASSISTD_NUMERICS: numerics must be 'fast', 'exact' or 'llama', not 'slow'")
    r = _run("serve", "--print-config")
    assert r.returncode == 0 and 'numerics = "fast"' in r.stdout  # the default


@pytest.mark.local_target("the numerics of a local llama.cpp Target")
def test_complete_runs_the_numerics_given_or_the_config_files(repo, tmp_path):
    """`complete --numerics llama` runs llama.cpp's defaults in its own process (ggml's
    GGML_CPU_TILED_MM is per process) and says its promise; the one-line stats name a
    batch-argmax promise where drafts were verified; in-process `complete` takes the
    config file's numerics, as the daemon would (the same Target for both)."""
    f = repo / "users.py"
    args = ("complete", "--file", f, "--line", 15, "--max-tokens", 12, "--numerics", "llama",
            "--proposer", "ngram", "--k", "8", "--no-daemon")
    r = assistd(*args, "--json", db=tmp_path / "h.db")
    assert r.returncode == 0, r.stderr
    target = json.loads(r.stdout)["target"]
    assert (target["numerics"], target["promise"]) == ("llama", "batch-argmax")
    r = assistd(*args, db=tmp_path / "h.db")
    assert r.returncode == 0, r.stderr
    line = r.stderr.strip().splitlines()[-1]
    assert (" promise=batch-argmax" in line) is (" rounds=0 " not in line), line
    config = tmp_path / "config.toml"
    config.write_text('numerics = "exact"\n')
    env = {"ASSISTD_CONFIG": str(config), "ASSISTD_DB": str(tmp_path / "h.db")}
    r = _run("complete", "--file", f, "--line", 15, "--max-tokens", 4, "--json", "--no-daemon",
             env=env)
    assert r.returncode == 0, r.stderr
    target = json.loads(r.stdout)["target"]
    assert (target["numerics"], target["promise"]) == ("exact", "exact")
