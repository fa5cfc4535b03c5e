"""A GGUF's tokenizer without its weights, for a remote Target given ``--model``: prompt
budgets and the history's token space are then the local Target's (same fingerprint),
and nothing is tokenized on the server."""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Sequence
from pathlib import Path

from assistd.ground.errors import ModelError
from assistd.targets.base import tokenizer_fingerprint

class LlamaVocab:
    """A GGUF's tokenizer without its weights (llama.cpp ``vocab_only``); tokenizes and
    renders pieces as :class:`assistd.targets.llama.LlamaTarget` does (its methods)."""

    def __init__(self, path: Path):
        from assistd.targets.llama import LlamaTarget, check_model_file

        check_model_file(path)
        import llama_cpp

        # The model alone, no context: a context over a vocabulary without weights
        # only logs a warning about its training length.
        params = llama_cpp.llama_model_default_params()
        params.vocab_only = True
        llama_cpp.llama_backend_init()
        # llama-cpp-python's log callback prints llama.cpp's errors to stderr: the
        # user gets the one line below instead (as LlamaTarget's verbose=False does)
        quiet = logging.getLogger("llama-cpp-python")
        level = quiet.level
        quiet.setLevel(logging.CRITICAL + 1)
        try:
            self._model = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
        finally:
            quiet.setLevel(level)
        if not self._model:
            raise ModelError(f"failed to load model {path}: cannot read its vocabulary; pass"
                             " the GGUF of the server's model, or no --model (the server's"
                             " tokenizer is used)")
        self._lib, self._pieces = llama_cpp, {}
        self._vocab = vocab = llama_cpp.llama_model_get_vocab(self._model)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
        bos = llama_cpp.llama_vocab_bos(vocab)
        self.bos_token_id = bos if bos >= 0 else None
        self.add_bos = bool(llama_cpp.llama_vocab_get_add_bos(vocab))
        self.eos_token_ids = frozenset(i for i in range(self.n_vocab)
                                       if llama_cpp.llama_vocab_is_eog(vocab, i))
        self.fingerprint = tokenizer_fingerprint(
            llama_cpp.llama_vocab_get_text(vocab, i) or b"" for i in range(self.n_vocab))
        self._L = LlamaTarget

    def tokenize(self, text):
        return self._L.tokenize(self, text)

    def detokenize(self, ids, prev=None):
        return self._L.detokenize(self, ids, prev)

    def _piece(self, token):
        return self._L._piece(self, token)

    def pieces(self):
        return self._L.pieces(self)

    def special_ids(self):
        return self._L.special_ids(self)

    def fim_tokens(self):
        return self._L.fim_tokens(self)

    def text_of(self, ids: Sequence[int]) -> str:
        """``ids`` as the text a server's tokenizer (special tokens parsed) gives back:
        control tokens spelled out, unlike :meth:`detokenize`."""
        out = []
        for t in ids:
            buf = (ctypes.c_char * 256)()
            n = self._lib.llama_token_to_piece(self._vocab, int(t), buf, 256, 0, True)
            out.append(bytes(buf[:max(n, 0)]))
        return b"".join(out).decode("utf-8", errors="replace")

    def close(self):
        if self._model:
            self._lib.llama_model_free(self._model)
            self._model = None
