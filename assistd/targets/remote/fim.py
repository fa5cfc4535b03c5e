"""Fill-in-the-middle on a remote Target (:class:`Fim`, a part of
:class:`assistd.targets.remote.target.RemoteTarget`): which markers frame the prefix and
the suffix, configured (``target_fim``) or found in the tokenizer. assistd's own marker
ids sit above the vocabulary and are spelled out when the prompt is sent
(:meth:`assistd.targets.remote.prompts.Prompting.prompt_text`)."""

from __future__ import annotations

import logging

from assistd.targets.remote.errors import RemoteTargetError
from assistd.targets.remote.tokenizer import Tokenizing

log = logging.getLogger("assistd.targets.remote")  # one logger for the whole remote Target

# FIM layouts by model family: the (prefix, suffix, middle) markers, sent in that
# order (prefix-suffix-middle), as the models' tokenizers spell them.
FIM_FAMILIES = {
    # StarCoder(2), SantaCoder, Granite code
    "starcoder": ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"),
    "qwen": ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),  # Qwen2.5-Coder, CodeGemma
    "deepseek": ("<\uff5cfim\u2581begin\uff5c>", "<\uff5cfim\u2581hole\uff5c>",
                 "<\uff5cfim\u2581end\uff5c>"),  # DeepSeek-Coder
}
FIM_SETTINGS = ("auto", "none", *FIM_FAMILIES)
_UNDECIDED = object()


class Fim(Tokenizing):
    """The FIM methods of a remote Target (a mixin of ``RemoteTarget``). Reads ``fim``
    (the setting: "auto", "none" or a family of :data:`FIM_FAMILIES`), ``n_vocab`` and
    the tokenizer (:class:`Tokenizing`); its own state is set by :meth:`_init_fim`."""

    def _init_fim(self) -> None:
        self._fim = _UNDECIDED  # (prefix, suffix, middle) ids or None, once decided
        self._fim_text: dict[int, str] = {}  # assistd's own marker ids -> their text

    def fim_tokens(self) -> tuple[int, int, int] | None:
        """The FIM ids ``(prefix, suffix, middle)``, or None (prefix-only prompts).

        ``fim`` "none": None. A family: ids of assistd's own above the vocabulary, which
        :meth:`prompt_text` spells as the family's markers. "auto": the local tokenizer's
        FIM tokens when ``--model`` names one (a GGUF's declared ones; in a Hugging Face
        folder, the tokens named as llama.cpp names FIM markers); else the server's
        tokenizer: the first family whose three markers it tokenizes as one token each
        (llama.cpp's ``/tokenize`` and llama-cpp-python's ``/extras/tokenize`` parse
        special tokens; ``/props`` and ``/v1/models`` say nothing of FIM); else None,
        said once in the log. Decided on first use; while the server cannot be asked, None for now."""
        if self._fim is _UNDECIDED:
            with self._lock:
                if self._fim is _UNDECIDED:
                    self._fim = self._find_fim()
        return None if self._fim is _UNDECIDED else self._fim

    def _markers(self, family: str) -> tuple[int, int, int]:
        base = self.n_vocab  # above every id a tokenizer gives (code points in char mode)
        self._fim_text = {base + i: m for i, m in enumerate(FIM_FAMILIES[family])}
        return (base, base + 1, base + 2)

    def _find_fim(self):
        if self.fim == "none":
            return None
        if self.fim != "auto":
            log.info("remote Target %s: FIM layout %s (configured)", self.url, self.fim)
            return self._markers(self.fim)
        if self._vocab is not None:
            ids = self._vocab.fim_tokens()
            if ids is None:
                log.info("remote Target %s: the local tokenizer (--model) has no FIM tokens:"
                         " prompts are prefix-only (set target_fim to a family if the model has FIM)",
                         self.url)
            return ids
        try:
            mode = self._tokenizer()
            if mode == "server":
                for family, markers in FIM_FAMILIES.items():
                    if all(len(self._server_ids(m)) == 1 for m in markers):
                        log.info("remote Target %s: FIM layout %s (the server's tokenizer has"
                                 " its markers)", self.url, family)
                        return self._markers(family)
        except RemoteTargetError:
            return _UNDECIDED  # asked again on the next request
        log.info("remote Target %s: %s: prompts are prefix-only (set target_fim to a family"
                 " if the model has FIM)", self.url,
                 "its tokenizer knows no FIM markers" if mode == "server"
                 else "no tokenizer to read FIM markers from")
        return None
