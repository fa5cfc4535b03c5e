"""llama.cpp Target through llama-cpp-python's low-level API.

``llama_cpp.Llama`` loads the model and context; evaluation goes through our own
``llama_batch`` so that logits are computed only for the rows we ask for (the
high-level ``Llama.eval`` computes every row or only the last), and the KV cache
is rolled back exactly with ``llama_memory_seq_rm``.

Numerics (:mod:`assistd.ground.numerics`: the modes, the default, their promises).
ggml's CPU kernels pick their path by batch shape and thread count, and those paths
round differently: a token's logits, and the keys and values it leaves in the cache,
depend on how many tokens shared its ``llama_decode`` call. Measured here: up to 0.75-1
logits on SmolLM2 Q4_1 and 1.7 on Gemma 3 Q4_K_M under llama.cpp's defaults, enough to
flip tokens whose top-2 gap is over 1. ``fast`` (the default) and ``llama`` keep
llama.cpp's default kernels, whose batches are cheapest (attention as matmuls, flash
attention off): speculative output is then the Target's argmax for the batch it
verified. ``exact`` uses only paths whose result per token does not depend on the batch:

- flash attention, whose per-query kernel reduces over the cache in one fixed order;
- ubatches of at most ``EXACT_UBATCH`` tokens, under the 64-query tile at which ggml
  switches to a tiled attention kernel that rounds differently;
- one thread for one-token ubatches: with more, ggml splits a single query's
  reduction over the cache across threads once the cache view reaches 512 cells
  (``use_split_kv_path`` in ggml-cpu's ``ops.cpp``); batches keep every thread;
- no weight repacking (``use_extra_bufts``: interleaved gemm kernels for batches of
  4+ rows) and no tiled K-quant matmul (``GGML_CPU_TILED_MM=0``: 8+ rows).

Then batched and one-token evaluation are bit-identical on the CPU, and speculative
output equals plain decoding token for token, at a cost measured on 2 cores after
1,000 tokens of context: t(1) 24.6 ms against 13.2, t(4) 39.9 against 31.3 (SmolLM2).
``GGML_CPU_TILED_MM`` is read once per process, so ``fast`` (and ``exact``) turn it off
and ``llama`` (the benchmarks' baseline: llama.cpp exactly as it ships) needs a process
of its own. A GPU offload is never batch-invariant; speculation stays on and the
promise is the batch's argmax (:attr:`LlamaTarget.promise`).

Token trees (``tree_branches`` > 0; docs/design.md, "Contracts the next pieces build
on"): one ``llama_batch`` holds every node, at position ``n_past + depth``, each token
carrying the sequence id of every branch (leaf) through it, so that llama.cpp's mask
lets a node see the cached tokens and its own ancestors only (the multi-sequence
batches of llama.cpp's ``examples/speculative`` and ``lookahead``). Branch ids are
spare sequence ids reserved at construction; llama.cpp couples sequences in one batch
only in a unified KV cache, so trees take the one-batch path on a Target with one
sequence (its unified cache is then the one stream it had anyway). After the round the
accepted path's cells are kept only where they lie right after the cached ones (nodes
``0..j``, the first branch in node order); the rest of the path is evaluated again as
a chain, so the sequence's cells stay contiguous and in position order, as exact
numerics need. Without ``tree_branches``, and with several sequences, a tree is
evaluated one branch at a time (:meth:`Target._evaluate_tree`).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from assistd.ground.errors import ModelError
from assistd.ground.options import DEFAULT_N_CTX
from assistd.ground.numerics import DEFAULT_NUMERICS, NUMERICS, PROMISES, promise, tiled_mm
from assistd.targets.base import Target, choose_sequences, encodable, tokenizer_fingerprint
from assistd.targets.gguf_header import gguf_metadata

GGUF_MAGIC = b"GGUF"
# ggml-cpu's flash attention tiles queries from GGML_FA_TILE_Q = 64 rows on, with
# another rounding; a ubatch of fewer tokens always takes the per-query kernel.
EXACT_UBATCH = 48
log = logging.getLogger("assistd.targets")
# GGML_CPU_TILED_MM is read once per process by ggml, at its first K-quant matmul: the
# value the first Target of the process set (None: none opened yet).
_tiled_mm_fixed: str | None = None


def check_model_file(path: Path) -> None:
    """Raise :class:`ModelError` unless ``path`` is a readable GGUF file."""
    fix = "pass --model PATH to a GGUF file, or install the default: pip install 'assistd[default]'"
    if not path.exists():
        raise ModelError(f"model file not found: {path}; {fix}")
    if not path.is_file():
        raise ModelError(f"model path is not a file: {path}; {fix}")
    try:
        with path.open("rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise ModelError(f"model file unreadable: {path} ({e.strerror}); {fix}") from None
    if magic != GGUF_MAGIC:
        raise ModelError(f"not a GGUF model file: {path}; {fix}")


class LlamaTarget(Target):
    """A GGUF model on llama.cpp.

    n_ctx: context window (tokens); n_threads: CPU threads [default: all usable
    cores]; n_gpu_layers: layers to offload when the build supports a GPU; n_batch:
    tokens per ``llama_decode`` call; numerics: one of
    :data:`assistd.ground.numerics.NUMERICS` (see the module). Raises :class:`ModelError`
    when the file is missing, unreadable, not GGUF, or fails to load, and ValueError
    for an unknown ``numerics`` or one whose ``GGML_CPU_TILED_MM`` this process has
    already fixed otherwise (``llama`` beside ``fast``/``exact``). tree_branches:
    leaves a token tree may have in one batch (spare sequence ids; 0: trees go one
    branch at a time); needs ``sequences=1`` (ValueError otherwise), see the module.
    """

    backend = "llama"

    def __init__(self, model_path: str | Path, *, n_ctx: int = DEFAULT_N_CTX,
                 n_threads: int | None = None,
                 n_gpu_layers: int = 0, n_batch: int = 512, numerics: str = DEFAULT_NUMERICS,
                 sequences: int | str = 1, tree_branches: int = 0):
        super().__init__()
        if numerics not in NUMERICS:
            raise ValueError(f"unknown numerics {numerics!r}; use one of {', '.join(NUMERICS)}")
        fix_tiled_mm(numerics)  # before loading: a refusal is not a load failure
        if tree_branches < 0:
            raise ValueError(f"tree_branches must be >= 0, not {tree_branches}")
        path = Path(model_path).expanduser()
        check_model_file(path)
        try:
            import llama_cpp
        except ImportError:
            raise ModelError(
                "llama-cpp-python is not installed; pip install 'assistd[llama]'"
            ) from None
        self._lib = llama_cpp
        threads = n_threads or len(os.sched_getaffinity(0))
        self.kv_bytes_per_token = kv_bytes_per_token(path)
        n_seq = choose_sequences(sequences, self.kv_bytes_per_token, n_ctx)
        if tree_branches and n_seq > 1:
            raise ValueError(
                f"tree_branches needs one KV sequence, not {n_seq}: llama.cpp batches a token "
                "into several sequences only in a unified cache, and several sequences in one "
                "unified cache are not batch-invariant")
        try:
            # Separate KV streams (kv_unified off), n_ctx cells each: a sequence's cells
            # stay contiguous and in position order as with one sequence, so the
            # attention kernels reduce in the same order and exact numerics hold.
            self._llm = open_llama(path, numerics=numerics, threads=threads,
                                   n_ctx=n_ctx * n_seq, n_seq=n_seq, spare_seq=tree_branches,
                                   n_batch=n_batch,
                                   n_gpu_layers=n_gpu_layers, logits_all=False)
        except Exception as e:  # llama-cpp-python raises ValueError/RuntimeError/OSError
            if "llama_context" in str(e):
                raise ModelError(
                    f"cannot create a context of n_ctx={n_ctx} tokens for {path}: {e}; "
                    "pass a smaller --n-ctx"
                ) from None
            raise ModelError(
                f"failed to load model {path}: {e}; check that the file is a complete GGUF "
                "model (re-download or re-install it), or pass --model PATH"
            ) from None
        self.model_path = str(path)
        self.n_ctx = llama_cpp.llama_n_ctx_seq(self._llm.ctx)  # per sequence
        self._init_sequences(n_seq)
        self.n_vocab = self._llm.n_vocab()
        # llama-cpp-python caps n_batch at the n_ctx asked for, while llama.cpp pads
        # n_ctx up (64 -> 256): chunk by the capped value, or llama_decode aborts.
        self.n_batch = self._llm.n_batch
        self.n_threads = threads
        offload = n_gpu_layers != 0 and bool(llama_cpp.llama_supports_gpu_offload())
        n_layer = llama_cpp.llama_model_n_layer(self._llm.model)
        self.n_gpu_layers = (n_layer if n_gpu_layers < 0 else min(n_gpu_layers, n_layer)) if offload else 0
        self.device = f"gpu ({self.n_gpu_layers}/{n_layer} layers)" if self.n_gpu_layers else "cpu"
        self.numerics = numerics
        # A GPU offload is not batch-invariant: speculation stays on, and the promise is
        # the batch's argmax, as vLLM's and llama.cpp's own speculation promise.
        self.promise = promise(numerics, gpu=bool(self.n_gpu_layers))
        if self.promise != "exact":
            why = "a GPU offload's kernels" if numerics == "exact" else f"{numerics} numerics"
            log.info("%s: %s: %s", path.name, why, PROMISES[self.promise])
        self._ctx = self._llm.ctx
        self._mem = llama_cpp.llama_get_memory(self._ctx)
        self._vocab = vocab = llama_cpp.llama_model_get_vocab(self._llm.model)
        self._pieces: dict[int, bytes] = {}
        pieces = [llama_cpp.llama_vocab_get_text(vocab, i) or b"" for i in range(self.n_vocab)]
        self.fingerprint = tokenizer_fingerprint(pieces)
        self.eos_token_ids = frozenset(
            i for i in range(self.n_vocab) if llama_cpp.llama_vocab_is_eog(vocab, i)
        )
        bos = self._llm.token_bos()
        self.bos_token_id = bos if bos >= 0 else None
        self.add_bos = bool(llama_cpp.llama_vocab_get_add_bos(vocab))
        self._batch = llama_cpp.llama_batch_init(self.n_batch, 0, 1)
        self.tree_branches = tree_branches
        self._tree_batch = (llama_cpp.llama_batch_init(self.n_batch, 0, tree_branches)
                            if tree_branches else None)
        self._tree_seqs = 0  # branch ids (from n_seq_max on) a tree batch holds now
        self._node_seq: list[int] = []  # per tree node: the first branch id through it
        self._closed = False

    # -- Target -------------------------------------------------------------

    def _evaluate(self, tokens: list[int], rows: list[int], n_past: int) -> np.ndarray:
        out = np.empty((len(rows), self.n_vocab), dtype=np.float32)
        want = set(rows)
        lib, b = self._lib, self._batch
        for start in range(0, len(tokens), self.n_batch):
            chunk = tokens[start : start + self.n_batch]
            b.n_tokens = len(chunk)
            for i, tok in enumerate(chunk):
                b.token[i] = tok
                b.pos[i] = n_past + i
                b.n_seq_id[i] = 1
                b.seq_id[i][0] = self.seq
                b.logits[i] = (start + i) in want
            rc = lib.llama_decode(self._ctx, b)
            if rc != 0:
                raise RuntimeError(f"llama_decode failed with code {rc} at position {n_past}")
            row_bytes = self.n_vocab * 4
            for r_out, r in enumerate(rows):
                if start <= r < start + len(chunk):
                    # memmove, not np.ctypeslib.as_array: that builds a ctypes array
                    # type per call, ~0.2 ms each, on every decode step.
                    ptr = lib.llama_get_logits_ith(self._ctx, r - start)
                    ctypes.memmove(out.ctypes.data + r_out * row_bytes, ptr, row_bytes)
            n_past += len(chunk)
        return out

    def _truncate(self, n: int) -> None:
        if not self._lib.llama_memory_seq_rm(self._mem, self.seq, n, -1):
            raise RuntimeError(f"KV cache rollback to {n} failed")

    @property
    def tree_leaves(self) -> int | None:
        """``tree_branches`` (one batch carries that many branch ids), 1 without."""
        return self.tree_branches or 1

    def _evaluate_tree(self, tree, n_past: int) -> np.ndarray:
        """One batch for the whole tree (see the module); the base class's branch by
        branch evaluation when this Target reserves no branch ids."""
        if not self.tree_branches:
            return super()._evaluate_tree(tree, n_past)
        leaves = tree.leaves()
        if len(leaves) > self.tree_branches:
            raise ValueError(f"a tree of {len(leaves)} leaves; this Target batches at most "
                             f"{self.tree_branches} (tree_branches)")
        if len(tree) > self.n_batch:
            raise ValueError(f"a tree of {len(tree)} nodes exceeds n_batch={self.n_batch}")
        lib, b, first = self._lib, self._tree_batch, self.n_seq_max
        seqs: list[list[int]] = [[] for _ in range(len(tree))]
        for j, leaf in enumerate(leaves):
            for i in tree.path_to(leaf):
                seqs[i].append(first + j)
        self._node_seq = [s[0] for s in seqs]
        self._tree_seqs = len(leaves)
        for j in range(len(leaves)):  # each branch sees the cached tokens
            lib.llama_memory_seq_cp(self._mem, self.seq, first + j, -1, -1)
        b.n_tokens = len(tree)
        for i, tok in enumerate(tree.tokens):
            b.token[i] = tok
            b.pos[i] = n_past + tree.depth[i]
            b.n_seq_id[i] = len(seqs[i])
            for k, s in enumerate(seqs[i]):
                b.seq_id[i][k] = s
            b.logits[i] = True
        rc = lib.llama_decode(self._ctx, b)
        if rc != 0:
            raise RuntimeError(f"llama_decode failed with code {rc} on a tree at position {n_past}")
        out = np.empty((len(tree), self.n_vocab), dtype=np.float32)
        row_bytes = self.n_vocab * 4
        for i in range(len(tree)):
            ctypes.memmove(out.ctypes.data + i * row_bytes, lib.llama_get_logits_ith(self._ctx, i), row_bytes)
        return out

    def _keep_path(self, tree, path: list[int], n_past: int) -> None:
        """Keep the cells of the path's prefix ``0, 1, .., j-1`` (right after the cached
        ones), free every other tree cell, evaluate the rest of the path as a chain."""
        if not self.tree_branches:
            return super()._keep_path(tree, path, n_past)
        j = 1
        while j < len(path) and path[j] == j:
            j += 1
        self._lib.llama_memory_seq_cp(self._mem, self._node_seq[path[j - 1]], self.seq, n_past, n_past + j)
        self._free_branches()
        rest = [tree.tokens[i] for i in path[j:]]
        if rest:
            self._evaluate(rest, [], n_past + j)

    def _drop_tree(self, tree, n_past: int) -> None:
        if self.tree_branches:
            self._free_branches()
        self._truncate(n_past)

    def _free_branches(self) -> None:
        for s in range(self.n_seq_max, self.n_seq_max + self._tree_seqs):
            self._lib.llama_memory_seq_rm(self._mem, s, -1, -1)
        self._tree_seqs = 0

    def tokenize(self, text: str) -> list[int]:
        """Text -> token ids (no BOS, special tokens as plain text).

        Our own call of ``llama_tokenize``: llama-cpp-python's sizes its buffer to the
        model's training context, so any text over that many tokens (8,192 for SmolLM2:
        a 25 kB source file) was tokenized twice. A text never has more tokens than
        UTF-8 bytes, so one buffer of that size always suffices.
        """
        data = encodable(text).encode("utf-8")
        cap = len(data) + 1
        buf = (ctypes.c_int32 * cap)()
        n = self._lib.llama_tokenize(self._vocab, data, len(data), buf, cap, False, False)
        if n < 0:  # cannot happen (see above); keep llama.cpp's contract anyway
            cap = -n
            buf = (ctypes.c_int32 * cap)()
            n = self._lib.llama_tokenize(self._vocab, data, len(data), buf, cap, False, False)
        return np.frombuffer(buf, dtype=np.int32, count=n).tolist()

    def detokenize(self, ids: Sequence[int], prev: Sequence[int] | None = None) -> str:
        """Concatenated piece bytes (control tokens render as nothing), decoded as UTF-8.

        Our own loop over ``llama_token_to_piece``: llama-cpp-python's ``detokenize``
        uses a 32-byte buffer and silently drops longer pieces (47 SmolLM2 tokens, e.g.
        a newline plus 32 spaces of indentation). Pieces carry their own leading
        spaces, so ``prev`` does not change the text; a space right after a leading BOS
        is dropped, as llama.cpp's SentencePiece models expect.
        """
        ids = [int(i) for i in ids]
        data = b"".join(self._piece(i) for i in ids)
        if ids and ids[0] == self.bos_token_id and data[:1] == b" ":
            data = data[1:]
        return data.decode("utf-8", errors="replace")

    def _piece(self, token: int) -> bytes:
        piece = self._pieces.get(token)
        if piece is None:
            size = 64
            while True:
                buf = (ctypes.c_char * size)()
                n = self._lib.llama_token_to_piece(self._vocab, token, buf, size, 0, False)
                if n >= 0:
                    break
                size = -n  # too small: llama.cpp returns minus the size it needs
            piece = self._pieces[token] = bytes(buf[:n])
        return piece

    def pieces(self) -> list[bytes]:
        lib, vocab = self._lib, self._vocab
        return [lib.llama_vocab_get_text(vocab, i) or b"" for i in range(self.n_vocab)]

    def special_ids(self) -> frozenset[int]:
        lib, vocab, control = self._lib, self._vocab, self._lib.LLAMA_TOKEN_ATTR_CONTROL
        return frozenset(i for i in range(self.n_vocab) if lib.llama_vocab_get_attr(vocab, i) & control)

    def fim_tokens(self) -> tuple[int, int, int] | None:
        lib, vocab = self._lib, self._vocab
        ids = (lib.llama_vocab_fim_pre(vocab), lib.llama_vocab_fim_suf(vocab),
               lib.llama_vocab_fim_mid(vocab))
        return ids if min(ids) >= 0 else None

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._lib.llama_batch_free(self._batch)
            if self._tree_batch is not None:
                self._lib.llama_batch_free(self._tree_batch)
            self._llm.close()


def open_llama(path: Path, *, numerics: str, threads: int, n_batch: int = 512, n_seq: int = 1,
               spare_seq: int = 0, **kwargs):
    """A ``llama_cpp.Llama`` with the kernels of ``numerics`` (see the module): for
    ``"exact"`` flash attention, ubatches of at most ``EXACT_UBATCH`` tokens, no weight
    repacking, no tiled K-quant matmul, ``threads`` for batches and one thread for
    one-token ubatches; ``"fast"`` and ``"llama"``: llama.cpp's defaults on ``threads``
    (``"fast"`` without the tiled K-quant matmul). ``n_seq`` > 1: that many KV sequences in
    separate streams, the ``n_ctx`` in ``kwargs`` split evenly between them.
    ``spare_seq`` > 0 (with ``n_seq == 1``): that many more sequence ids in one unified
    cache, for token trees. ``kwargs`` go to ``Llama`` (n_ctx, n_gpu_layers, logits_all,
    draft_model...). Raises ValueError for an unknown mode or one this process cannot
    host (:func:`fix_tiled_mm`), and what ``Llama`` raises."""
    import llama_cpp

    if numerics not in NUMERICS:
        raise ValueError(f"unknown numerics {numerics!r}; use one of {', '.join(NUMERICS)}")
    fix_tiled_mm(numerics)

    if spare_seq:
        context = {"n_seq_max": n_seq + spare_seq, "kv_unified": True}
    else:
        context = {"n_seq_max": n_seq, "kv_unified": False} if n_seq > 1 else {}
    if numerics != "exact":
        # llama.cpp's default kernels, flash attention off as llama-cpp-python's Llama()
        # has it: measured here at 1,000-1,500 tokens of context it is the faster
        # choice (SmolLM2, 2 threads: t(1) 13.2-14.2 ms against 13.3-15.9 with it on,
        # t(4) 31-32 against 37-45). "fast" differs from "llama" only in the tiled
        # K-quant matmul (batches of 8+ rows of a K-quant model), which ggml fixes per
        # process (fix_tiled_mm).
        with _default_params(llama_cpp, context=context):
            return llama_cpp.Llama(model_path=str(path), n_batch=n_batch, n_ubatch=n_batch,
                                   n_threads=threads, n_threads_batch=threads,
                                   flash_attn=False, verbose=False, **kwargs)
    with _default_params(llama_cpp, model={"use_extra_bufts": False}, context=context):
        return llama_cpp.Llama(model_path=str(path), n_batch=n_batch,
                               n_ubatch=min(n_batch, EXACT_UBATCH), n_threads=1,
                               n_threads_batch=threads, flash_attn=True, verbose=False, **kwargs)


def fix_tiled_mm(numerics: str) -> None:
    """Set ``GGML_CPU_TILED_MM`` for ``numerics`` (:func:`assistd.ground.numerics.tiled_mm`)
    the first time a Target opens in this process; later, raise ValueError if the mode
    needs the other value. ggml reads the variable once per process, so ``llama`` and
    ``fast``/``exact`` each need a process of their own (``assistd bench`` runs
    its baseline in one)."""
    global _tiled_mm_fixed
    want = tiled_mm(numerics)
    if _tiled_mm_fixed is None:
        os.environ["GGML_CPU_TILED_MM"] = want  # over the caller's: ggml reads it once
        _tiled_mm_fixed = want
    elif _tiled_mm_fixed != want:
        have = "llama" if _tiled_mm_fixed == "1" else "fast/exact"
        raise ValueError(f"numerics {numerics!r} cannot run in a process that already runs "
                         f"{have} numerics: ggml reads GGML_CPU_TILED_MM once per process; "
                         "open it in a process of its own")


@contextlib.contextmanager
def _default_params(llama_cpp, *, model: dict | None = None, context: dict | None = None):
    """``Llama()`` with fields of its model and context parameters set that it has no
    argument for (``use_extra_bufts``; ``n_seq_max``, ``kv_unified``).

    llama-cpp-python builds them from ``llama_model_default_params()`` and
    ``llama_context_default_params()``, so those defaults are swapped for the duration
    of the call (``Llama`` then sets the fields it has arguments for on top).
    """
    lib = llama_cpp.llama_cpp
    saved = {"llama_model_default_params": lib.llama_model_default_params,
             "llama_context_default_params": lib.llama_context_default_params}

    def with_fields(default, fields):
        def params():
            p = default()
            for name, value in fields.items():
                setattr(p, name, value)
            return p
        return params

    for name, fields in (("llama_model_default_params", model),
                         ("llama_context_default_params", context)):
        if fields:
            setattr(lib, name, with_fields(saved[name], fields))
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(lib, name, fn)


def kv_bytes_per_token(path: Path) -> int:
    """KV cache bytes one token takes in one sequence (f16 keys and values, every
    layer), from the GGUF metadata; 0 when the metadata lacks the sizes."""
    try:
        arch = gguf_metadata(path, {"general.architecture"}).get("general.architecture")
        keys = {f"{arch}.{k}" for k in ("block_count", "embedding_length",
                                        "attention.head_count", "attention.head_count_kv",
                                        "attention.key_length", "attention.value_length")}
        m = {k.split(".", 1)[1]: v for k, v in gguf_metadata(path, keys).items()}
        layers = int(m["block_count"])
        heads = m["attention.head_count"]
        heads = max(heads) if isinstance(heads, list) else int(heads)
        kv_heads = m.get("attention.head_count_kv", heads)
        per_layer = kv_heads if isinstance(kv_heads, list) else [int(kv_heads)] * layers
        head_k = int(m.get("attention.key_length", int(m["embedding_length"]) // heads))
        head_v = int(m.get("attention.value_length", head_k))
    except (ValueError, KeyError, TypeError, OSError):
        return 0
    return sum(int(h) * (head_k + head_v) * 2 for h in per_layer)
