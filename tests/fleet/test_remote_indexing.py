"""In front of a remote Target, the daemon's history is kept in the served model's token
space when the served model's tokenizer is here (its GGUF, or its Hugging Face folder):
that is the history vLLM's proposer drafts from (assistd.fleet.vllm_proposer). With the
server's tokenizer nothing is indexed (tests/targets/test_remote_context.py)."""

from __future__ import annotations

from assistd.runtime.runtime import Runtime
from assistd.targets.open import default_model_path
from tests.conftest import make_repo

SOURCE = "def area(w, h):\n    return w * h\n\n\ndef perimeter(w, h):\n    return 2 * (w + h)\n"


def test_a_chosen_repository_is_indexed_in_the_served_token_space(llama_server, tmp_path):
    """``--repo`` on a remote Target given the server model's GGUF: the repository is
    tokenized into the history under that tokenizer's fingerprint, with the ids the
    tokenizer gives, while no in-memory drafting index is loaded (nothing drafts here)."""
    repo = make_repo(tmp_path / "repo", {"shapes.py": SOURCE})
    rt = Runtime.open(default_model_path(), db=tmp_path / "history.db",
                      target_options={"backend": "openai", "target_url": llama_server})
    try:
        t = rt.target
        assert t.remote and t.local_tokenizer
        scope = rt.resolve_scope(repo, chosen=True)
        assert scope.root == str(repo.resolve()) and scope.report.tokenized == 1
        docs = rt.store.token_arrays(scope.root, t.fingerprint)
        assert [(name, ids.tolist()) for _, name, ids in docs] == [
            ("shapes.py", t.tokenize(SOURCE))]
        assert rt.index.scopes() == []
    finally:
        rt.close()
