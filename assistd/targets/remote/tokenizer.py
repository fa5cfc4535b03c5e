"""How a remote Target tokenizes, for prompt budgets and the history's token space
(:class:`Tokenizing`, a part of :class:`assistd.targets.remote.target.RemoteTarget`).

In this order:

1. ``model`` given: its own vocabulary, from a GGUF file loaded by llama.cpp without
   the weights (:class:`assistd.targets.remote.gguf_vocab.LlamaVocab`) or from a Hugging
   Face folder's tokenizer.json (:class:`assistd.targets.remote.hf_vocab.HFVocab`); the
   fingerprint is the local Target's, so both share a history.
2. the server's tokenize endpoint: llama-cpp-python's ``/extras/tokenize`` or the
   ``/tokenize`` of llama.cpp's server and vLLM. Spellings shaped like a control token
   (:data:`CONTROL_SHAPE`) are asked about first, so that they stay text
   (:meth:`Tokenizing._classify`).
3. else a character budget: one id per character, :data:`CHARS_PER_TOKEN` characters
   per token, said once in the log.
"""

from __future__ import annotations

import logging
import math
import re
import threading
from collections.abc import Sequence

import httpx

from assistd.targets.base import Target, encodable
from assistd.targets.remote.errors import RemoteTargetError
from assistd.targets.remote.network import Answer

log = logging.getLogger("assistd.targets.remote")  # one logger for the whole remote Target

CHARS_PER_TOKEN = 4  # the character budget when no tokenizer is known
# What a control token's spelling looks like in the vocabularies assistd knows
# (<|im_start|>, <start_of_turn>, </s>, <｜fim▁begin｜>, [INST]): the candidates a
# server without a local tokenizer is asked about (see Tokenizing.control_spellings).
CONTROL_SHAPE = re.compile(r"<[^\s<>]{1,64}>|\[/?[A-Z][A-Z_]{1,30}\]")
SHAPES_KEPT = 4096  # classified spellings remembered (ordinary ones are forgotten first)


class Tokenizing(Target):
    """The tokenizer methods of a remote Target (a mixin of ``RemoteTarget``). Reads the
    Target's ``server`` (:class:`assistd.targets.remote.network.Server`), ``url``,
    ``model_name`` and ``_vocab`` (a ``LlamaVocab``, an ``HFVocab`` or None); its own
    state is set by :meth:`_init_tokenizer`."""

    def _init_tokenizer(self) -> None:
        self._mode = "model" if self._vocab else None  # "model" | "server" | "chars"
        self._tok_path = None  # the server's tokenize endpoint, once found
        # Server mode: spellings of CONTROL_SHAPE classified by the server: the control
        # tokens (spelling -> id, and back), and those it reads as ordinary text.
        self._learned: dict[str, int] = {}
        self._learned_text: dict[int, str] = {}
        self._ordinary: dict[str, None] = {}  # (a dict: insertion-ordered, trimmed oldest first)
        self._plain_tokenize = False  # the server honours parse_special: false (llama.cpp's)
        self._lock = threading.RLock()  # (fim_tokens holds it while the tokenizer is found)

    @property
    def local_tokenizer(self) -> bool:
        """Whether tokenizing stays on this machine (a local tokenizer was given): else
        text to tokenize goes to the server, so the daemon keeps the history's watcher
        off (:func:`assistd.serving.daemon.serve`) and editors' buffers are not indexed."""
        return self._vocab is not None

    def _tokenizer(self) -> str:
        """The tokenizer mode, found on first use (the server must answer then)."""
        if self._mode is None:
            with self._lock:
                if self._mode is None:
                    self._find_tokenizer()
        return self._mode

    def _find_tokenizer(self) -> None:
        for path in ("/extras/tokenize", "/tokenize"):
            try:
                r = self.server.fetch("POST", path, json=self._tok_body("a"))
            except httpx.HTTPError as e:
                raise RemoteTargetError(self.server.transport_message(e)) from None
            if r.status_code == 200 and isinstance(self._ids_of(r), list):
                self._mode, self._tok_path = "server", path
                log.info("remote Target %s: prompt budgets use the server's %s", self.url, path)
                return
            if r.status_code not in (200, 404, 405):  # a refused key, a failing server:
                raise RemoteTargetError(self.server.http_message(r.status_code, r.text, r.headers),
                                        "http")
        self._mode = "chars"  # (not decided on an error: it would stick)
        log.warning("remote Target %s has no tokenize endpoint and no --model tokenizer was"
                    " given: prompt budgets count %d characters per token", self.url,
                    CHARS_PER_TOKEN)

    def _tok_body(self, text: str) -> dict:
        # llama-cpp-python reads "input", llama.cpp "content", vLLM "prompt".
        body = {"input": text, "content": text, "prompt": text, "add_special": False,
                "add_special_tokens": False}
        if self.model_name:
            body["model"] = self.model_name
        return body

    @staticmethod
    def _ids_of(r: Answer) -> list[int] | None:
        """The ids of a tokenize answer (ints, or objects with an ``id``), or None when
        it holds anything else."""
        try:
            toks = r.json().get("tokens")
        except (ValueError, AttributeError):
            return None
        if not isinstance(toks, list):
            return None
        ids = [t.get("id") if isinstance(t, dict) else t for t in toks]
        ok = all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < 1 << 31 for i in ids)
        return ids if ok else None

    @property
    def chars_per_token(self) -> int:
        """Characters one prompt token stands for: 1, or :data:`CHARS_PER_TOKEN` when
        ids are characters (no tokenizer known)."""
        return CHARS_PER_TOKEN if self._tokenizer() == "chars" else 1

    def tokenize(self, text: str) -> list[int]:
        """``text`` -> the server model's ids, control-token spellings as plain text (the
        :class:`Target` contract): the local tokenizer, else the server's (asked about
        spellings of a control token's shape first: :meth:`_classify`), else one id per
        character. Raises :class:`RemoteTargetError` when the server cannot answer."""
        mode = self._tokenizer()
        if mode == "model":
            return self._vocab.tokenize(text)
        if mode == "chars":
            return [ord(c) for c in encodable(text)]
        text = encodable(text)
        controls = [m for m in self._classify(text) if m in text]
        if self._plain_tokenize:  # the server tokenizes plain text when asked
            return self._server_ids(text, parse_special=False)
        if not controls:
            return self._server_ids(text)
        # Control spellings as text: each one's first character tokenized apart from the
        # rest, so that the server cannot read it whole (the ids spell the same text).
        pattern = re.compile("|".join(map(re.escape, sorted(controls, key=len, reverse=True))))
        ids, pos = [], 0
        for m in pattern.finditer(text):
            ids += self._server_ids(text[pos:m.start() + 1])  # up to its first character
            pos = m.start() + 1
        return ids + self._server_ids(text[pos:])

    def _server_ids(self, text: str, parse_special: bool = True) -> list[int]:
        """The server's tokenization of ``text``: control spellings parsed (see
        :meth:`tokenize`), or not where ``parse_special`` is False and the server honours
        it (llama.cpp's ``/tokenize`` does; llama-cpp-python's always parses them)."""
        if not text:
            return []
        try:
            r = self.server.fetch("POST", self._tok_path, json={**self._tok_body(text),
                                                          "parse_special": parse_special})
        except httpx.HTTPError as e:
            raise RemoteTargetError(self.server.transport_message(e)) from None
        ids = self._ids_of(r) if r.status_code == 200 else None
        if ids is None:
            why = self.server.http_message(r.status_code, r.text, r.headers)
            raise RemoteTargetError(f"the remote Target {self.url} could not tokenize ({why})",
                                    "http" if r.status_code != 200 else "malformed")
        return ids

    def _classify(self, text: str) -> dict[str, int]:
        """Server mode: ask the server about each spelling in ``text`` that looks like a
        control token (:data:`CONTROL_SHAPE`) and was not asked about yet; returns the
        control tokens learned so far (spelling -> id). A spelling is a control token when
        the server tokenizes it as one id, and either tokenizes it otherwise with
        ``parse_special`` false (llama.cpp's server) or its detokenizer leaves that id out
        (llama.cpp renders control tokens as nothing unless asked; llama-cpp-python's
        ``/extras/detokenize`` does not ask). A server that does neither teaches nothing
        here: its prompts stay as they were (README, "Known limit")."""
        for m in dict.fromkeys(CONTROL_SHAPE.findall(text)):
            if m in self._learned or m in self._ordinary:
                continue
            ids = self._server_ids(m)
            plain = self._server_ids(m, parse_special=False) if len(ids) == 1 else ids
            if plain != ids:
                self._plain_tokenize = True
            if len(ids) == 1 and ids[0] not in self._learned_text and (
                    plain != ids or self._detokenize_server(ids) == ""):
                self._learned[m], self._learned_text[ids[0]] = ids[0], m
            else:
                self._ordinary[m] = None
                if len(self._ordinary) > SHAPES_KEPT:
                    del self._ordinary[next(iter(self._ordinary))]
        return self._learned

    def control_spellings(self, text: str = "") -> dict[str, int]:
        """The local tokenizer's control tokens with ``--model``; else those the server
        taught so far, after asking it about ``text``'s (:meth:`_classify`); none in
        character mode."""
        mode = self._tokenizer()
        if mode == "model":
            return super().control_spellings(text)
        if mode == "server":
            return self._classify(encodable(text))
        return {}

    def detokenize(self, ids: Sequence[int], prev: Sequence[int] | None = None) -> str:
        mode = self._tokenizer()
        if mode == "model":
            return self._vocab.detokenize(ids, prev)
        if mode == "chars":
            return "".join(map(chr, ids))
        return self._detokenize_server(ids)

    def _detokenize_server(self, ids: Sequence[int]) -> str:
        path = self._tok_path.replace("tokenize", "detokenize")
        try:
            model = {"model": self.model_name} if self.model_name else {}
            r = self.server.fetch("POST", path, json={"tokens": [int(i) for i in ids], **model})
            data = r.json() if r.status_code == 200 else None
        except httpx.HTTPError as e:
            raise RemoteTargetError(self.server.transport_message(e)) from None
        except ValueError as e:
            raise RemoteTargetError(f"the remote Target {self.url} could not detokenize:"
                                    f" {self.server.shown(e)}", "malformed") from None
        text = next((data[k] for k in ("text", "content", "prompt")
                     if isinstance(data, dict) and isinstance(data.get(k), str)), None)
        if text is None:
            raise RemoteTargetError(f"the remote Target {self.url} could not detokenize"
                                    f" (HTTP {r.status_code})",
                                    "http" if r.status_code != 200 else "malformed")
        return text


    def prompt_tokens(self, ids: Sequence[int]) -> int:
        """Server tokens the prompt ``ids`` stands for (characters / 4 in char mode)."""
        return math.ceil(len(ids) / self.chars_per_token)

    def pieces(self) -> list[bytes]:
        # Unknown vocabulary: one placeholder as long as a token's text may be, so that
        # byte-size checks stay lenient.
        return self._vocab.pieces() if self._vocab else [b"\0" * 64]

    def special_ids(self) -> frozenset[int]:
        return self._vocab.special_ids() if self._vocab else frozenset(self._learned_text)
