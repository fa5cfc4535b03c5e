"""Daemon configuration: defaults < TOML file < ASSISTD_* environment < flags."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from assistd.serving.config import Config, load_config
from assistd.ground.errors import InputError


def test_precedence_file_then_environment_then_flags(tmp_path):
    """Settings come from the file, then the environment over it, then flags over both; an unset
    flag overrides nothing, and the sources are listed lowest first."""
    f = tmp_path / "config.toml"
    f.write_text('n_ctx = 1024\nproposer = "ngram"\nrepos = ["/a", "/b"]\nk = "8"\n'
                 'agent_transcripts = false\n')
    env = {"ASSISTD_N_CTX": "2048", "ASSISTD_REPOS": os.pathsep.join(["/c", "/d"]),
           "ASSISTD_ALLOW_REMOTE": "yes"}
    c, sources = load_config(f, {"n_ctx": 512, "model": None}, env)
    assert c.n_ctx == 512  # flag over environment over file
    assert c.proposer == "ngram" and c.k == "8" and c.agent_transcripts is False  # file
    assert c.repos == ["/c", "/d"] and c.allow_remote is True  # environment
    assert c.model is None  # a flag left unset does not override
    assert sources == ["defaults", str(f), "$ASSISTD_N_CTX", "$ASSISTD_REPOS",
                       "$ASSISTD_ALLOW_REMOTE", "--n_ctx".replace("_", "-")]


def test_missing_default_file_is_fine_but_a_named_one_is_not(tmp_path):
    """Without the default config file the defaults apply; a config file named but missing is an
    InputError ('does not exist')."""
    c, sources = load_config(None, {}, {})  # XDG_CONFIG_HOME is a fresh tmp dir (conftest)
    assert c == Config() and sources == ["defaults"]
    with pytest.raises(InputError, match="does not exist"):
        load_config(tmp_path / "nope.toml", {}, {})


@pytest.mark.parametrize("text,needle", [
    ("n_ctx = ", "not valid TOML"),
    ("colour = 'blue'", "unknown key(s) colour"),
    ("n_ctx = 'big'", "n_ctx must be an integer"),
    ("repos = '/a'", "repos must be a list of strings"),
    ("agent_transcripts = 1", "true or false"),
    ("backend = 'tpu'", "backend must be 'llama', 'torch' or 'openai', not 'tpu'"),
    ("k = 'lots'", "k must be 'auto'"),
    ("tcp = 'localhost'", "is not HOST:PORT"),
    ("log_level = 'loud'", "log_level"),
    ("proposer = 'nope'", "proposer must be one of none"),
    ("k = 99", "k must be 'auto'"),
    # a newcomer's remote URL went unused without a word on the local backend
    ("target_url = 'http://127.0.0.1:1'", "target_url is set but backend is 'llama'"),
])
def test_bad_files_name_the_key(tmp_path, text, needle):
    """A config file that is not TOML, has an unknown key or a value of the wrong type or range,
    or sets target_url with the local backend is refused with a message naming the key and what
    it must be."""
    f = tmp_path / "c.toml"
    f.write_text(text)
    with pytest.raises(InputError) as e:
        load_config(f, {}, {})
    assert needle in str(e.value)


def test_k_may_be_a_toml_integer(tmp_path):
    """k = 8 as a TOML integer is taken (as the string '8')."""
    f = tmp_path / "c.toml"
    f.write_text("k = 8\n")
    assert load_config(f, {}, {})[0].k == "8"


def test_bad_environment_value_names_the_variable():
    """A bad ASSISTD_N_CTX is refused naming the variable: '$ASSISTD_N_CTX: n_ctx must be an
    integer'."""
    with pytest.raises(InputError, match=r"\$ASSISTD_N_CTX: n_ctx must be an integer"):
        load_config(None, {}, {"ASSISTD_N_CTX": "many"})


def _serve(*args, env=None):
    return subprocess.run([sys.executable, "-m", "assistd", "serve", *args],
                          env={**os.environ, **(env or {})}, capture_output=True, text=True,
                          timeout=60)


def test_print_config_shows_the_effective_toml(tmp_path):
    """`serve --print-config` prints valid TOML of the effective settings, a first line listing
    the sources lowest first, and each value set outside the defaults commented with its
    source."""
    f = tmp_path / "c.toml"
    f.write_text('max_history_mb = 100\n')
    r = _serve("--config", str(f), "--tcp", "127.0.0.1:9999", "--print-config",
               env={"ASSISTD_PROPOSER": "ngram"})
    assert r.returncode == 0, r.stderr
    out = r.stdout
    first = out.splitlines()[0]
    assert first.startswith(f"# sources, lowest first: defaults, {f}, ")
    assert "$ASSISTD_PROPOSER" in first and first.endswith(", --tcp")
    import tomllib

    parsed = tomllib.loads(out)  # what it prints is valid TOML the file could hold
    assert parsed["max_history_mb"] == 100 and parsed["proposer"] == "ngram"
    assert parsed["tcp"] == "127.0.0.1:9999" and parsed["socket_path"].endswith(".sock")
    assert "token_path" in parsed
    assert f"max_history_mb = 100  # {f}" in out and 'proposer = "ngram"  # $ASSISTD_PROPOSER' in out


def test_serve_refuses_a_non_loopback_address_and_a_public_token_file(tmp_path):
    """`serve --tcp 0.0.0.0:...` exits 2 (not a loopback address) and a token file readable by
    others exits 2 (chmod 600), neither leaving a socket."""
    r = _serve("--tcp", "0.0.0.0:9999", "--socket", str(tmp_path / "s.sock"),
               "--log-file", str(tmp_path / "log"))
    assert r.returncode == 2 and "not a loopback address" in r.stderr
    token = tmp_path / "token"
    token.write_text("secret\n")
    token.chmod(0o644)
    r = _serve("--tcp", "127.0.0.1:9999", "--token-file", str(token), "--socket",
               str(tmp_path / "s.sock"), "--log-file", str(tmp_path / "log"))
    assert r.returncode == 2 and "chmod 600" in r.stderr
    assert not (tmp_path / "s.sock").exists()


def test_serve_with_a_missing_or_corrupt_model_says_so_and_leaves_no_socket(tmp_path):
    """`serve` with a missing or corrupt model file exits 2 with an error naming the file and
    leaves no socket."""
    bad = tmp_path / "model.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 64)
    for model in (tmp_path / "missing.gguf", bad):
        r = _serve("--model", str(model), "--socket", str(tmp_path / "s.sock"),
                   "--db", str(tmp_path / "h.db"), "--no-agent-transcripts",
                   "--log-file", str(tmp_path / "log"))
        assert r.returncode == 2, r.stderr
        assert str(model) in r.stderr and "error:" in r.stderr
        assert not (tmp_path / "s.sock").exists()
