"""The Target's settings, typed once (assistd/targets/spec.py): one precedence (flag,
then ASSISTD_*, then the config file, then the default), one validation, and errors that
name where a bad value came from."""

from __future__ import annotations

import pytest

from assistd.ground.errors import InputError
from assistd.targets.spec import (DEFAULT_N_CTX, TargetSpec, default_config_file, load,
                                  resolve)
from editors.settings import environment_settings, parse_settings


def _file(tmp_path, text: str):
    f = tmp_path / "config.toml"
    f.write_text(text)
    return f


def test_flag_over_environment_over_file_over_default(tmp_path):
    """Each key from the highest source that gives it; the origins say which."""
    f = _file(tmp_path, 'n_ctx = 1024\nthreads = 3\nnumerics = "exact"\nrepos = ["/r"]\n')
    env = {"ASSISTD_N_CTX": "2048", "ASSISTD_THREADS": "2"}
    spec, origins = resolve({"n_ctx": 512, "device": None}, config_file=f, environ=env)
    assert (spec.n_ctx, spec.threads, spec.numerics, spec.device) == (512, 2, "exact", "auto")
    assert origins == {"n_ctx": "--n-ctx", "threads": "$ASSISTD_THREADS", "numerics": str(f)}
    assert load(environ={}, config_file=f).n_ctx == 1024  # the daemon's other keys: its own
    assert load(environ={}).n_ctx == DEFAULT_N_CTX == TargetSpec().n_ctx


def test_the_config_file_is_found_as_the_daemon_finds_it(tmp_path):
    """$ASSISTD_CONFIG names the file (it must exist); else the default one, when it exists."""
    f = _file(tmp_path, "n_ctx = 300\n")
    assert load(environ={"ASSISTD_CONFIG": str(f)}).n_ctx == 300
    assert default_config_file({"ASSISTD_CONFIG": str(f)}) == f
    with pytest.raises(InputError, match="does not exist"):
        load(environ={"ASSISTD_CONFIG": str(tmp_path / "none.toml")})
    assert load(environ={}) == TargetSpec()  # (no default file in the test's config dir)


@pytest.mark.parametrize("flags,env,text,message", [
    ({"n_ctx": 10}, {}, "", "--n-ctx must be at least 64, not 10"),
    ({}, {"ASSISTD_N_CTX": "many"}, "", "$ASSISTD_N_CTX: n_ctx must be an integer, not 'many'"),
    ({}, {}, "n_ctx = 10\n", "config file {f}: n_ctx must be at least 64, not 10"),
    ({}, {}, 'numerics = "fastest"\n',
     "config file {f}: numerics must be 'fast', 'exact' or 'llama', not 'fastest'"),
    ({"device": "tpu"}, {}, "", "--device must be auto, cpu, cuda, cuda:N or mps, not 'tpu'"),
    ({}, {"ASSISTD_THREADS": "0"}, "", "$ASSISTD_THREADS: threads must be at least 1, not '0'"),
    ({"backend": "openai"}, {}, "",
     "--backend openai needs --target-url (the server's base URL, e.g. http://127.0.0.1:8080)"),
    ({}, {"ASSISTD_TARGET_URL": "http://127.0.0.1:1"}, "",
     "$ASSISTD_TARGET_URL: target_url is set but backend is 'llama'"),
    ({}, {"ASSISTD_BACKEND": "openai"}, 'target_url = "ftp://x"\n',
     "config file {f}: target_url 'ftp://x' must be http(s)://HOST[:PORT]"),
    ({"backend": "openai", "target_url": "http://h:1", "target_fim": "bogus"}, {}, "",
     "--target-fim must be one of auto, none, starcoder, qwen, deepseek, not 'bogus'"),
])
def test_a_bad_value_names_its_source(tmp_path, flags, env, text, message):
    """The flag itself, the variable, or the config file's path and key."""
    f = _file(tmp_path, text)
    with pytest.raises(InputError) as e:
        resolve(flags, environ=env, config_file=f)
    assert message.format(f=f) in str(e.value)


def test_a_bad_editor_setting_names_the_setting_and_keeps_the_value_before(tmp_path):
    """An editor's setting takes the flag's place for its session; a bad one warns with
    its LSP name and keeps what the environment and config file gave (never raises)."""
    f = _file(tmp_path, "n_ctx = 1024\nthreads = 2\n")
    base, w = environment_settings({"ASSISTD_CONFIG": str(f), "ASSISTD_NUMERICS": "exact"})
    assert w == [] and (base.target.n_ctx, base.target.threads, base.target.numerics) == (
        1024, 2, "exact")
    s, w = parse_settings({"assistd": {"nCtx": 512, "threads": 0}}, base)
    assert (s.target.n_ctx, s.target.threads) == (512, 2)  # the editor's over the file's
    assert w == ["assistd setting 'threads'=0 is invalid: threads must be at least 1, not 0;"
                 " using 2"]
    s, w = parse_settings({"targetUrl": "http://127.0.0.1:8080"}, base)  # no backend openai
    assert s.target == base.target and "targetUrl" in w[0] and "backend is 'llama'" in w[0]


def test_a_bad_file_or_variable_warns_an_in_process_editor_server(tmp_path):
    """A file's `n_ctx = 5` warns "... not 5; using DEFAULT_N_CTX" and keeps the default; a
    missing $ASSISTD_CONFIG file warns "does not exist" and gives TargetSpec()."""
    f = _file(tmp_path, "n_ctx = 5\n")
    s, w = environment_settings({"ASSISTD_CONFIG": str(f)})
    assert s.target.n_ctx == DEFAULT_N_CTX
    assert w == [f"config file {f}: n_ctx must be at least 64, not 5; using {DEFAULT_N_CTX}"]
    s, w = environment_settings({"ASSISTD_CONFIG": str(tmp_path / "none.toml")})
    assert s.target == TargetSpec() and "does not exist" in w[0]


def test_the_key_comes_from_the_environment_only_and_is_never_shown(tmp_path):
    """$ASSISTD_TARGET_KEY is read; no flag, setting or file key carries it; repr, str
    and the settings written out never show it."""
    env = {"ASSISTD_BACKEND": "openai", "ASSISTD_TARGET_URL": "http://127.0.0.1:8080/v1",
           "ASSISTD_TARGET_KEY": "sk-secret-123"}
    spec = load(environ=env, config_file=_file(tmp_path, ""))
    assert spec.key() == "sk-secret-123" and spec.target_url == "http://127.0.0.1:8080"
    for shown in (repr(spec), str(spec), str(spec.settings())):
        assert "sk-secret" not in shown
    with pytest.raises(InputError, match="never read from a file"):
        load(environ={}, config_file=_file(tmp_path, 'target_key = "sk-x"\n'))
    with pytest.raises(InputError, match="not a flag"):
        load({"target_key": "sk-x"}, environ={})
    s, w = parse_settings({"targetKey": "sk-x"})
    assert s.target.target_key is None and w == ["unknown assistd setting 'targetKey' ignored"]


def test_every_field_is_described():
    """The configuration reference is generated from these descriptions."""
    assert all(f.description for f in TargetSpec.model_fields.values())


def test_the_old_keywords_still_make_a_spec():
    """open_target's former keywords (seconds, n_threads), for callers not yet moved."""
    from assistd.targets.spec import from_options

    spec = from_options("/m.gguf", n_ctx=512, n_threads=2, backend="torch", device="cpu")
    assert spec == TargetSpec(model="/m.gguf", n_ctx=512, threads=2, backend="torch",
                              device="cpu")
    remote = from_options(None, backend="openai", target_url="http://h:1",
                          target_timeout_s=2.5, target_deadline_s=9)
    assert (remote.target_timeout_ms, remote.target_deadline_ms) == (2500, 9000)


def test_a_local_backend_above_a_server_leaves_the_server_unused(tmp_path):
    """`complete --backend llama` beside a config file (or environment) naming a remote
    server: the server is not used, and that is no error; a URL above a local backend
    still is (it would go unused by mistake)."""
    f = _file(tmp_path, 'backend = "openai"\ntarget_url = "http://127.0.0.1:8080"\n')
    spec, origins = resolve({"backend": "llama"}, config_file=f, environ={})
    assert (spec.backend, spec.target_url) == ("llama", None) and "target_url" not in origins
    with pytest.raises(InputError, match="target_url is set but backend is 'llama'"):
        resolve({}, config_file=_file(tmp_path, 'backend = "llama"\n'),
                environ={"ASSISTD_TARGET_URL": "http://127.0.0.1:8080"})
    base, _ = environment_settings({"ASSISTD_CONFIG": str(f)})
    s, w = parse_settings({"backend": "llama"}, base)  # an editor's own local Target
    assert (s.target.backend, s.target.target_url, w) == ("llama", None, [])
