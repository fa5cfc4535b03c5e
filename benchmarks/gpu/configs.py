"""Published model shapes for the t(n, context) sweep, built with random weights.

The numbers are copied from each model's ``config.json`` on the Hugging Face hub (no
download at run time); only the shapes matter for timing, so the weights are random
(transformers' own initialisation). ``small`` shrinks every shape to a few layers and a
narrow width for the CPU rehearsal: the same code path, not the same numbers.
"""

from __future__ import annotations

# name -> (transformers config class, its arguments, source)
PUBLISHED = {
    # HuggingFaceTB/SmolLM2-135M-Instruct config.json: the embedded default Target's shapes.
    "smollm2-135m": ("LlamaConfig", dict(
        hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
        num_key_value_heads=3, vocab_size=49152, max_position_embeddings=8192,
        rope_theta=100000.0, rms_norm_eps=1e-5, tie_word_embeddings=True),
        "HuggingFaceTB/SmolLM2-135M-Instruct"),
    # Qwen/Qwen2.5-Coder-1.5B(-Instruct) config.json.
    "qwen2.5-coder-1.5b": ("Qwen2Config", dict(
        hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
        num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768,
        rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True),
        "Qwen/Qwen2.5-Coder-1.5B"),
    # Qwen/Qwen2.5-Coder-7B(-Instruct) config.json (the Qwen2.5-7B architecture).
    "qwen2.5-coder-7b": ("Qwen2Config", dict(
        hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
        num_key_value_heads=4, vocab_size=152064, max_position_embeddings=32768,
        rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=False),
        "Qwen/Qwen2.5-Coder-7B"),
}

# The CPU rehearsal's shrink: the family and head layout kept, two layers, a narrow width
# and a 4,096-token vocabulary, so that a shape builds and runs in a second on 2 cores.
SMALL = dict(num_hidden_layers=2, intermediate_size=256, vocab_size=4096)


def config_for(name: str, small: bool):
    """The transformers config of ``name`` (a key of :data:`PUBLISHED`), shrunk when
    ``small``; raises KeyError for an unknown name."""
    import transformers

    cls_name, args, _ = PUBLISHED[name]
    args = dict(args)
    if small:
        heads, kv = args["num_attention_heads"], args["num_key_value_heads"]
        args.update(SMALL, hidden_size=heads * 16, num_attention_heads=heads, num_key_value_heads=kv)
        args["head_dim"] = 16
    return getattr(transformers, cls_name)(**args)


def random_model(name: str, small: bool, device: str, dtype: str):
    """A causal LM of ``name``'s shapes with random weights, built directly on ``device``
    (a 7B model is initialised on the GPU in seconds, not on the CPU in minutes), eval mode."""
    import torch
    from transformers import AutoModelForCausalLM

    config = config_for(name, small)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    return model.eval()


def shape_summary(config) -> dict:
    """The shape numbers a ledger records, from a transformers config."""
    c = config.get_text_config()
    keys = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "vocab_size", "tie_word_embeddings")
    return {"model_type": c.model_type, **{k: getattr(c, k, None) for k in keys}}
