"""The arms of ``assistd bench`` (:mod:`assistd.measure.bench`): what each one decodes
with (:class:`Arm`, :func:`arms_for`), and the in-stack library peers, whose decode loop
is their own (:func:`library_peer_for`)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from assistd.ground.errors import InputError

PEER_RULE_K = {"peer:llama-cpp-python-pld": 10, "peer:transformers-pld": 10,
               "peer:suffixdecoding": 16,
               # Arctic's vLLM default num_speculative_tokens for suffix decoding
               "peer:arctic": 16, "peer:arctic-tree": 16}
TREE_BRANCHES = 16  # leaves of a tree round on llama.cpp (KV sequence ids in one batch)
LIBRARY_PEERS = {"llama": "llama-cpp-python PLD (library)",
                 "torch": "transformers prompt lookup (library)"}


@dataclass(frozen=True)
class Arm:
    """One way of decoding: ``kind`` is plain | proposer | peer-rule | peer-library;
    ``k`` the ceiling (tokens) or ``"auto"``; ``tree``: the proposer's token-tree mode
    (the arm is then named ``proposer+tree``); ``numerics``: a plain arm's mode when it
    runs in a companion process (None: the main process)."""

    name: str
    kind: str
    proposer: str | None
    k: int | str
    tree: bool = False
    numerics: str | None = None


def arms_for(proposers: Sequence[str], k: int | str, *, library_peer: str | None,
             draft_model: bool = False, tree: str = "off",
             companions: Sequence[str] = ()) -> list[Arm]:
    """Plain first, ``plain:MODE`` for each companion numerics mode, then the proposers
    named (a ``peer:`` name runs at its peer's k; ``NAME+tree`` and ``tree`` as
    :func:`assistd.measure.replay.tree_arms`), ``draft_model`` when a draft is given,
    and the library peer named ``library_peer``. Raises :class:`InputError` for an
    unknown arm."""
    from assistd.measure.bench_rewrite import is_prediction_arm
    from assistd.measure.replay import split_arm, tree_arms

    arms = [Arm("plain", "plain", None, 0)]
    arms += [Arm(f"plain:{m}", "plain", None, 0, numerics=m) for m in companions]
    # The prediction arms draft from each case's prediction (the rewrite workload).
    arms += [Arm(n, "prediction", n, k) for n in proposers if is_prediction_arm(n)]
    proposers = [n for n in proposers if not is_prediction_arm(n)]
    for name in tree_arms(proposers, tree):
        proposer, is_tree = split_arm(name)
        if proposer == "draft_model" and not draft_model:
            raise InputError("--proposer draft_model needs --draft-model PATH")
        if proposer.startswith("peer:"):
            arms.append(Arm(name, "peer-rule", proposer, PEER_RULE_K.get(proposer, 10), is_tree))
        else:
            arms.append(Arm(name, "proposer", proposer, k, is_tree))
    if draft_model and "draft_model" not in proposers:
        arms.append(Arm("draft_model", "proposer", "draft_model", k))
    if library_peer:
        arms.append(Arm(library_peer, "peer-library", None, 10))
    return arms


DEFAULT_PROPOSERS = ("ngram", "suffix", "peer:suffixdecoding", "peer:llama-cpp-python-pld",
                     "peer:transformers-pld")


# ---------------------------------------------------------------- the library peer


class LlamaCppPromptLookup:
    """llama-cpp-python's own prompt-lookup decoding, on a second ``Llama`` of the
    Target's GGUF (``logits_all=True``, as ``LlamaPromptLookupDecoding`` requires)."""

    name = "llama-cpp-python PLD (library)"

    def __init__(self, target, *, num_pred_tokens: int = 10):
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        from assistd.targets.llama import open_llama

        threads = getattr(target, "n_threads", None) or 2
        # The Target's numerics, so that the peer's verification rounds like ours.
        self.llm = open_llama(
            target.model_path, numerics=target.numerics, threads=threads, n_ctx=target.n_ctx,
            logits_all=True, draft_model=LlamaPromptLookupDecoding(num_pred_tokens=num_pred_tokens))
        self.eos = self.llm.token_eos()

    @property
    def memory_bytes(self) -> int:
        """The score buffer ``logits_all`` adds: n_ctx × n_vocab float32 (bytes)."""
        return int(self.llm.scores.nbytes)

    def prefill(self, prompt: list[int]) -> None:
        """Evaluate all but the last prompt token, as the engine's prefill does; the
        calls that follow reuse it (llama-cpp-python keeps the longest common prefix).

        Not ``generate(prompt, 1)``: measured with llama-cpp-python 0.3.36, a
        prompt-lookup call that follows a call stopped after one token returns other
        tokens than greedy decoding (the first difference at a top-2 logit gap of 0.33,
        then two tokens skipped); after an ``eval`` prefill it matches."""
        self.llm.reset()
        self.llm.eval(prompt[:-1])

    def generate(self, prompt: list[int], max_tokens: int) -> tuple[list[int], float]:
        """Greedy tokens (a final EOS included, as the engine returns them) and wall ms."""
        out: list[int] = []
        t0 = time.perf_counter()
        for tok in self.llm.generate(prompt, top_k=1, top_p=1.0, min_p=0.0, temp=0.0,
                                     repeat_penalty=1.0):
            out.append(int(tok))
            if tok == self.eos or len(out) >= max_tokens:
                break
        return out, (time.perf_counter() - t0) * 1000

    def close(self) -> None:
        self.llm.close()


class TransformersPromptLookup:
    """transformers' own prompt lookup, ``model.generate(prompt_lookup_num_tokens=10,
    max_matching_ngram_size=2)``, greedy, on the torch Target's model object (no second
    copy). The prompt's KV cache is computed once per case and a copy is handed to every
    call (untimed), so it decodes from a cached prompt as the other arms do."""

    name = "transformers prompt lookup (library)"
    memory_bytes = 0  # the Target's own weights; its KV cache as the Target's

    def __init__(self, target, *, num_pred_tokens: int = 10, max_ngram_size: int = 2):
        self.target, self.lookup = target, {"prompt_lookup_num_tokens": num_pred_tokens,
                                            "max_matching_ngram_size": max_ngram_size}
        self._prompt, self._cache = None, None

    def prefill(self, prompt: list[int]) -> None:
        import torch
        from transformers import DynamicCache

        cache = DynamicCache()
        with torch.inference_mode():
            self.target.model(input_ids=torch.tensor([prompt[:-1]], device=self.target.device),
                              past_key_values=cache, use_cache=True)
        self._prompt, self._cache = list(prompt), cache

    def generate(self, prompt: list[int], max_tokens: int) -> tuple[list[int], float]:
        import copy

        import torch

        if self._prompt != list(prompt):
            self.prefill(prompt)
        cache = copy.deepcopy(self._cache)
        ids = torch.tensor([prompt], device=self.target.device)
        eos = sorted(self.target.eos_token_ids)
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = self.target.model.generate(
                ids, attention_mask=torch.ones_like(ids), past_key_values=cache,
                do_sample=False, max_new_tokens=max_tokens, eos_token_id=eos,
                pad_token_id=eos[0], **self.lookup)
        ms = (time.perf_counter() - t0) * 1000
        return [int(t) for t in out[0, len(prompt):].tolist()], ms

    def close(self) -> None:
        self._cache = None


def library_peer_for(target):
    """The in-stack peer library of the Target's backend."""
    return LlamaCppPromptLookup(target) if target.backend == "llama" \
        else TransformersPromptLookup(target)
