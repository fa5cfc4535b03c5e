"""What a remote Target's prompts carry off the machine (assistd/targets/remote/prompts.py,
editors/completer.py): cross-file snippets pass the secret filter, ``target_context =
"file"`` keeps them local, and the FIM layout comes from the tokenizer or the setting.

The bytes are read where they arrive: :class:`RecordingProxy` sits on loopback between
assistd and the real llama-cpp-python server (embedded model), forwards every request
and records each body; :class:`FimServer` stands in for a server whose model has FIM
tokens (the embedded model has none)."""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import replace

import httpx
import pytest

from assistd.runtime.runtime import Runtime, open_store
from assistd.targets.open import default_model_path
from assistd.targets.remote import FIM_FAMILIES, RemoteTarget
from assistd.targets.spec import TargetSpec
from editors.completer import Completer, Request
from editors.settings import Settings
from harness.ports import free_port
from tests.conftest import make_repo

SECRET = "sk-live-9f8e7d6c5b4a39281706f5e4d3c2b1a0"
DOC = ("from shapes import make_polygon\n\n\n"
       "def polygon_area(vertices):\n"
       "    poly = make_polygon(vertices)\n"
       "    return poly.")
SHAPES = ("class Polygon:\n"
          f"    api_key = \"{SECRET}\"\n"
          "    def __init__(self, vertices):\n"
          "        self.vertices = list(vertices)\n\n"
          "    def shoelace_area(self):\n"
          "        pts = self.vertices\n"
          "        return abs(sum(x0 * y1 - x1 * y0 for (x0, y0), (x1, y1)\n"
          "                       in zip(pts, pts[1:] + pts[:1]))) / 2\n\n\n"
          "def make_polygon(vertices):\n"
          "    return Polygon(vertices)\n")
SETTINGS = Settings(max_prompt_tokens=512, max_tokens=4, max_latency_ms=0, cross_file_tokens=200)
# The editor's setting targetContext "file" (the Target's settings live in Settings.target).
FILE_ONLY = replace(SETTINGS, target=TargetSpec(target_context="file"))


class _Loopback:
    """A starlette app served by uvicorn on a thread, on a free loopback port."""

    def serve(self, app):
        import uvicorn

        self.port = free_port()
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port,
                                                    log_level="critical", lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30  # a guard against hangs
        while not self.server.started and time.monotonic() < deadline:
            time.sleep(0.02)
        assert self.server.started
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)

    def prompts(self) -> list[str]:
        """The ``prompt`` of every ``/v1/completions`` body received, in order."""
        return [json.loads(b)["prompt"] for p, b in self.bodies if p == "/v1/completions"]


class RecordingProxy(_Loopback):
    """Forwards every request to ``upstream`` as it came and streams the answer back;
    ``bodies`` holds each (path, body bytes) received."""

    def __init__(self, upstream: str):
        from starlette.applications import Starlette
        from starlette.responses import StreamingResponse
        from starlette.routing import Route

        self.bodies: list[tuple[str, bytes]] = []
        client = httpx.AsyncClient(base_url=upstream, timeout=120)

        async def forward(request):
            body = await request.body()
            self.bodies.append((request.url.path, body))
            headers = {k: v for k, v in request.headers.items()
                       if k.lower() not in ("host", "content-length")}
            r = await client.send(client.build_request(request.method, request.url.path,
                                                       content=body, headers=headers),
                                  stream=True)

            async def relay():
                try:
                    async for part in r.aiter_raw():
                        yield part
                finally:
                    await r.aclose()

            return StreamingResponse(relay(), status_code=r.status_code,
                                     media_type=r.headers.get("content-type"))

        self.serve(Starlette(routes=[Route("/{path:path}", forward,
                                           methods=["GET", "POST"])]))


class FimServer(_Loopback):
    """Stands in for a server whose model has FIM tokens (llama.cpp's server's
    ``/tokenize``, which parses special tokens): ``markers`` are one token each, any
    other character one token (1000 + its code point). ``/v1/completions`` streams
    ``"ok"``."""

    def __init__(self, markers: tuple[str, ...]):
        from starlette.applications import Starlette
        from starlette.responses import JSONResponse, StreamingResponse
        from starlette.routing import Route

        self.bodies: list[tuple[str, bytes]] = []
        special = {m: i for i, m in enumerate(markers, start=1)}

        def ids(text: str) -> list[int]:
            out, i = [], 0
            while i < len(text):
                m = next((m for m in special if text.startswith(m, i)), None)
                out.append(special[m] if m else 1000 + ord(text[i]))
                i += len(m) if m else 1
            return out

        async def tokenize(request):
            body = await request.body()
            self.bodies.append(("/tokenize", body))
            return JSONResponse({"tokens": ids(json.loads(body)["content"])})

        async def detokenize(request):
            back = {v: k for k, v in special.items()}
            toks = json.loads(await request.body())["tokens"]
            return JSONResponse({"content": "".join(back.get(t) or chr(t - 1000) for t in toks)})

        async def completions(request):
            self.bodies.append(("/v1/completions", await request.body()))

            async def stream():
                for text, finish in (("ok", None), ("", "length")):
                    body = {"choices": [{"text": text, "index": 0, "finish_reason": finish}]}
                    yield f"data: {json.dumps(body)}\n\n"
                yield "data: [DONE]\n\n"
            return StreamingResponse(stream(), media_type="text/event-stream")

        async def models(request):
            return JSONResponse({"object": "list", "data": [{"id": "fim-model"}]})

        async def missing(request):
            return JSONResponse({"detail": "Not Found"}, status_code=404)

        self.serve(Starlette(routes=[
            Route("/tokenize", tokenize, methods=["POST"]),
            Route("/detokenize", detokenize, methods=["POST"]),
            Route("/extras/tokenize", missing, methods=["POST"]),
            Route("/v1/completions", completions, methods=["POST"]),
            Route("/v1/models", models)]))


@pytest.fixture
def proxy(llama_server):
    p = RecordingProxy(llama_server)
    yield p
    p.stop()


def completer_on(tmp_path, url: str, settings: Settings = SETTINGS, **options):
    options.setdefault("model", default_model_path())  # the GGUF tokenizer: one round trip
    rt = Runtime.open(options.pop("model"), db=tmp_path / "h.db",
                      target_options={"backend": "openai", "target_url": url, **options})
    c = Completer(settings, shared=rt)
    c.open()
    return c


def ask(c: Completer, repo, text=DOC, offset=None, buffers=None):
    return c.complete(Request(uri=(repo / "geometry.py").as_uri(), text=text,
                              offset=len(text) if offset is None else offset,
                              language="python", buffers=buffers or {}))


def test_cross_file_snippets_reach_the_server_secret_filtered(proxy, tmp_path):
    """Cross-file snippets (another open buffer's class) go into the remote prompt with their
    secrets redacted; no request body holds the secret."""
    repo = make_repo(tmp_path / "r", {"geometry.py": DOC, "shapes.py": SHAPES})
    c = completer_on(tmp_path, proxy.url)
    try:
        assert ask(c, repo, buffers={(repo / "shapes.py").as_uri(): SHAPES}).source == "target"
        sent = proxy.prompts()[-1]
        assert "# shapes.py\nclass Polygon:" in sent and "def shoelace_area" in sent
        assert 'api_key = "[REDACTED]"' in sent  # the snippet went, its secret did not
        assert sent.endswith(DOC)
        raw = b"".join(b for _, b in proxy.bodies)  # nothing sent anywhere holds it
        assert SECRET.encode() not in raw and b"9f8e7d6c5b4a" not in raw
    finally:
        c.close()
        c.runtime.close()


@pytest.mark.parametrize("where", ["editor", "target"])
def test_target_context_file_sends_only_the_documents_text(proxy, tmp_path, where):
    """``targetContext: "file"`` (the editor's setting) or ``target_context = "file"``
    (the daemon's Target): no snippet of another file in what the server receives."""
    repo = make_repo(tmp_path / "r", {"geometry.py": DOC, "shapes.py": SHAPES})
    settings = FILE_ONLY if where == "editor" else SETTINGS
    options = {"target_context": "file"} if where == "target" else {}
    c = completer_on(tmp_path, proxy.url, settings, **options)
    try:
        assert ask(c, repo, buffers={(repo / "shapes.py").as_uri(): SHAPES}).source == "target"
        sent = proxy.prompts()[-1]
        assert sent == DOC  # the document's window, nothing else
        raw = b"".join(b for _, b in proxy.bodies)
        assert b"shoelace" not in raw and b"shapes.py" not in raw and b"REDACTED" not in raw
    finally:
        c.close()
        c.runtime.close()


# -- FIM layout ---------------------------------------------------------------------------


@pytest.mark.parametrize("tokenizer", ["server", "gguf"])
def test_no_fim_tokens_on_the_real_server_is_prefix_only_said_once(
        proxy, tmp_path, caplog, tokenizer):
    """SmolLM2 has no FIM tokens: its GGUF declares none and the server's tokenizer
    splits every family's markers, so auto means prefix-only prompts, said once."""
    caplog.set_level(logging.INFO, logger="assistd.targets.remote")
    repo = make_repo(tmp_path / "r", {"geometry.py": DOC})
    model = default_model_path() if tokenizer == "gguf" else None
    c = completer_on(tmp_path, proxy.url, model=model)
    try:
        assert c.target.fim_tokens() is None
        for _ in range(2):
            ask(c, repo, DOC + "\n\nx = 1\n", offset=len(DOC))
        assert proxy.prompts()[-1] == DOC  # no markers, no suffix
        said = [r.getMessage() for r in caplog.records if "prefix-only" in r.getMessage()]
        words = "local tokenizer (--model) has no FIM tokens" if model else "no FIM markers"
        assert len(said) == 1 and words in said[0]
    finally:
        c.close()
        c.runtime.close()


def test_a_configured_fim_family_lays_out_the_prompt_on_the_real_server(proxy, tmp_path):
    """With target_fim starcoder the prompt sent is the starcoder prefix, the text before the
    cursor, the suffix marker, the text after, and the middle marker."""
    repo = make_repo(tmp_path / "r", {"geometry.py": DOC})
    c = completer_on(tmp_path, proxy.url, target_fim="starcoder")
    try:
        ask(c, repo, DOC + "\n\nx = 1\n", offset=len(DOC))
        pre, suf, mid = FIM_FAMILIES["starcoder"]
        assert proxy.prompts()[-1] == f"{pre}{DOC}{suf}\n\nx = 1\n{mid}"
    finally:
        c.close()
        c.runtime.close()


def test_fim_tokens_the_server_reports_are_used(tmp_path, caplog):
    """FIM markers the server reports (qwen's) lay out the prompt, logged as FIM layout qwen;
    target_fim none turns FIM off whatever the server has."""
    caplog.set_level(logging.INFO, logger="assistd.targets.remote")
    markers = FIM_FAMILIES["qwen"]
    server = FimServer(markers)
    repo = make_repo(tmp_path / "r", {"geometry.py": DOC})
    c = completer_on(tmp_path, server.url, model=None)
    try:
        assert c.target.fim_tokens() is not None
        assert ask(c, repo, DOC + "\nz = 2\n", offset=len(DOC)).text == "ok"
        assert server.prompts()[-1] == f"{markers[0]}{DOC}{markers[1]}\nz = 2\n{markers[2]}"
        assert any("FIM layout qwen" in r.getMessage() for r in caplog.records)
        # "none" turns it off, whatever the server has.
        t = RemoteTarget(server.url, fim="none")
        assert t.fim_tokens() is None
        t.close()
    finally:
        c.close()
        c.runtime.close()
        server.stop()


def test_bad_context_and_fim_settings_are_refused(tmp_path):
    """A bad target_context or target_fim is refused naming the allowed values (in the config
    file's flag name); a bad editor setting falls back to 'all' with a warning."""
    from assistd.ground.errors import InputError
    from assistd.serving.config import load_config

    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(InputError, match="target_context must be all or file"):
        RemoteTarget(url, context="some")
    with pytest.raises(InputError, match="target_fim must be one of auto, none, starcoder"):
        RemoteTarget(url, fim="llama")
    with pytest.raises(InputError, match="--target-fim must be one of"):  # named as given
        (tmp_path / "c.toml").write_text("")
        load_config(tmp_path / "c.toml", {"backend": "openai", "target_url": url,
                                          "target_fim": "x"}, environ={})
    from editors.settings import parse_settings

    s, warnings = parse_settings({"assistd": {"targetContext": "nothing"}})
    assert s.target.target_context == "all" and warnings


def test_the_history_is_not_sent_to_the_servers_tokenizer(proxy, tmp_path):
    """Without a tokenizer GGUF the remote Target tokenizes on its server: the daemon's
    watcher then stays off (it would send every repository file and agent transcript
    there, to no use: nothing drafts against a remote Target), and an editor's other
    open buffers are not tokenized for the live history either."""
    from harness.daemon import start_daemon

    repo = make_repo(tmp_path / "repo", {"shapes.py": SHAPES, "geometry.py": DOC})
    d = start_daemon(tmp_path / "d", "--backend", "openai", "--target-url", proxy.url,
                     "--repo", str(repo))
    try:
        w = d.status()["watcher"]
        assert w["state"] == "off" and w["error"] is None and "--model" in w["off_reason"]
        with d.uds() as c:
            r = c.post("/v1/completions", json={"model": "remote", "prompt": "x = ",
                                                "max_tokens": 2, "temperature": 0})
            assert r.status_code == 200, r.text
    finally:
        assert d.stop() == 0
    c = completer_on(tmp_path, proxy.url, FILE_ONLY, model=None)
    try:
        ask(c, repo, buffers={(repo / "shapes.py").as_uri(): SHAPES})
    finally:
        c.close()
        c.runtime.close()
    raw = b"".join(b for _, b in proxy.bodies)
    assert proxy.prompts() and b"shoelace" not in raw and b"Polygon" not in raw
