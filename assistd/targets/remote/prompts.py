"""What a remote Target sends as the prompt (:class:`Prompting`, a part of
:class:`assistd.targets.remote.target.RemoteTarget`): token ids where the server takes
them (asked once: :meth:`Prompting.takes_token_ids`; llama.cpp's ``llama-server`` and
vLLM do), else text with control-token spellings defused (:meth:`Prompting.prompt_text`,
:func:`defuse`), so that a document which writes ``<|im_start|>`` reaches the model as
text, as it does on a local Target."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import httpx

from assistd.targets.remote.errors import RemoteTargetError
from assistd.targets.remote.tokenizer import Tokenizing

log = logging.getLogger("assistd.targets.remote")  # one logger for the whole remote Target

ZWSP = "\u200b"
_SENTINEL = "\ue000\ue0ff"  # private-use text standing in for a control token in one request


def defuse(text: str, spellings) -> str:
    """``text`` with every control spelling in ``spellings`` broken by a zero-width
    space after its first character, so that a server which parses control tokens in
    its prompt reads it as text.

    >>> defuse("a<|im_start|>b", ["<|im_start|>"]) == "a<" + ZWSP + "|im_start|>b"
    True
    """
    for m in spellings:
        if m in text:
            text = text.replace(m, m[0] + ZWSP + m[1:])
    return text


class Prompting(Tokenizing):
    """The prompt methods of a remote Target (a mixin of ``RemoteTarget``). Reads the
    tokenizer's state (:class:`Tokenizing`) and ``_fim_text`` (assistd's own FIM marker
    ids -> their text, :class:`assistd.targets.remote.fim.Fim`); its own state is set by
    :meth:`_init_prompting`."""

    def _init_prompting(self) -> None:
        self._controls = None  # (control ids, their spellings), read from the GGUF once
        self._sentinel: list[int] | None = None  # the server's ids of _SENTINEL
        self._takes_ids: bool | None = None  # whether /v1/completions takes token ids

    def prompt_text(self, ids: Sequence[int]) -> str:
        """The prompt to send for ``ids``: a leading BOS dropped when the model adds one
        (the server adds its own), control tokens spelled out so that the server parses
        them back (SmolLM2's BOS is also its chat turn marker, so it must stay)."""
        ids = list(ids)
        if ids and self.add_bos and ids[0] == self.bos_token_id:
            ids = ids[1:]
        mode = self._tokenizer()
        render = (self._text_of if mode == "model" else self._server_text if mode == "server"
                  else self.detokenize)
        if not self._fim_text or not any(i in self._fim_text for i in ids):
            return render(ids)
        out, run = [], []  # FIM markers of assistd's own: spelled out between the runs
        for i in ids + [None]:
            if i is None or i in self._fim_text:
                if run:
                    out.append(render(run))
                    run = []
                if i is not None:
                    out.append(self._fim_text[i])
            else:
                run.append(i)
        return "".join(out)

    def _text_of(self, ids: list[int]) -> str:
        """``ids`` as text for a server that parses control tokens in it: each control
        token spelled out, and a control token's spelling inside plain text (a message
        that writes ``<|im_start|>``, tokenized here as text) defused with a zero-width
        space after its first character, so the server reads it as text too, as the
        local Target does. Without the GGUF (the server tokenizes) this is not possible:
        README, "Known limit"."""
        if self._controls is None:
            special = self._vocab.special_ids()
            self._controls = (special, sorted({m for m in (self._vocab.text_of([i]) for i in special)
                                               if len(m) > 1}, key=len, reverse=True))
        special, marks = self._controls
        out, run = [], []
        for i in ids + [None]:
            if i is None or i in special:
                if run:
                    out.append(defuse(self._vocab.text_of(run), marks))
                    run = []
                if i is not None:
                    out.append(self._vocab.text_of([i]))
            else:
                run.append(i)
        return "".join(out)

    def prompt_ids(self, ids: Sequence[int]) -> list[int] | None:
        """The prompt to send as the server's own token ids, for a server that takes
        them (:meth:`takes_token_ids`): ``ids`` as a local Target would evaluate them
        (nothing is tokenized again there, so no text can become a control token), with
        assistd's FIM markers as the server vocabulary's. None when the ids are not the
        server's: character mode, or a FIM family the vocabulary has no markers for."""
        if self._tokenizer() == "chars":
            return None
        out = []
        for i in ids:
            if i in self._fim_text:
                marker = self._fim_text[i]
                i = self.control_spellings(marker).get(marker)
                if i is None:
                    return None
            out.append(int(i))
        return out

    def takes_token_ids(self) -> bool:
        """Whether the server's ``/v1/completions`` takes a prompt of token ids (vLLM
        and llama.cpp's ``llama-server`` do; llama-cpp-python's server takes text only
        and answers 500 with a validation error). Asked once, with a one-token prompt
        and ``max_tokens`` 1; a server that cannot be asked now (down, refusing the key,
        busy) is asked again on the next generation, which goes as text meanwhile."""
        if self._takes_ids is None and self._tokenizer() != "chars":
            try:
                probe = {"prompt": self.tokenize("a")[:1], "max_tokens": 1, "temperature": 0.0,
                         **({"model": self.model_name} if self.model_name else {})}
                r = self.server.fetch("POST", "/v1/completions", json=probe)
            except (httpx.HTTPError, RemoteTargetError):
                return False
            if r.status_code in (400, 422, 500):
                self._takes_ids = False
                log.info("remote Target %s takes text prompts only (HTTP %d to token ids):"
                         " control-token spellings in text are defused", self.url, r.status_code)
            elif r.status_code == 200:
                self._takes_ids = True
                log.info("remote Target %s takes token-id prompts: they are sent as ids", self.url)
        return bool(self._takes_ids)

    def _server_text(self, ids: list[int]) -> str:
        """``ids`` as text for the server, without a local tokenizer: the control tokens
        the server taught (:meth:`_classify`) spelled out, and their spellings inside the
        text between them defused (:func:`defuse`), as :meth:`_text_of` does with the
        GGUF. One detokenize request: each control token stands in as :data:`_SENTINEL`."""
        controls = [i for i in ids if i in self._learned_text]
        if not controls:
            return defuse(self._detokenize_server(ids), self._learned)
        if self._sentinel is None:
            self._sentinel = self._server_ids(_SENTINEL)
        joined = [t for i in ids for t in (self._sentinel if i in self._learned_text else (i,))]
        parts = self._detokenize_server(joined).split(_SENTINEL)
        if len(parts) != len(controls) + 1:  # the text holds the sentinel itself
            parts, run = [], []
            for i in ids:
                if i in self._learned_text:
                    parts.append(self._detokenize_server(run) if run else "")
                    run = []
                else:
                    run.append(i)
            parts.append(self._detokenize_server(run) if run else "")
        for text in parts:  # spellings the pieces form together are asked about too
            self._classify(text)
        out = [defuse(parts[0], self._learned)]
        for i, text in zip(controls, parts[1:]):
            out += [self._learned_text[i], defuse(text, self._learned)]
        return "".join(out)
