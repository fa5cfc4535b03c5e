"""assistd's history inside engines a team scales on: vLLM's custom proposer
(:mod:`assistd.fleet.vllm_proposer`). docs/scale.md, "vLLM with assistd's history"."""
