"""A Hugging Face tokenizer without its model, for a remote Target given ``--model`` as
the served model's folder (what vLLM serves: ``tokenizer.json`` beside
``tokenizer_config.json``, ``config.json``, ``generation_config.json``): prompts are
tokenized here, control-token spellings in text stay text, and the history's token
space is the one the GGUF of the same model gives (same fingerprint as
:class:`~assistd.targets.remote.gguf_vocab.LlamaVocab`).

Only the ``tokenizers`` library is used (no transformers, no torch): a daemon in front
of vLLM may have neither. Where llama.cpp decides something by itself (which tokens are
control tokens, the end-of-generation ids, FIM markers, the spelling of ids the
tokenizer lacks) this module follows llama.cpp and ``convert_hf_to_gguf.py``, so that a
folder and the GGUF converted from it agree.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace

from assistd.ground.errors import ModelError
from assistd.targets.base import encodable, tokenizer_fingerprint
from assistd.targets.vocab import EOG_TEXTS, FIM_EOG_TEXTS, eog_ids, piece_bytes

TOKENIZER_FILE = "tokenizer.json"
# llama.cpp's names of the FIM markers (src/llama-vocab.cpp, "find FIM_PRE token" ...):
# the first of each found makes the (prefix, suffix, middle) ids.
FIM_NAMES = (
    ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<\uff5cfim\u2581begin\uff5c>", "<PRE>",
     "\u2581<PRE>", "<|code_prefix|>", "<|prefix|>"),
    ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<\uff5cfim\u2581hole\uff5c>", "<SUF>",
     "\u2581<SUF>", "<|code_suffix|>", "<|suffix|>"),
    ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<\uff5cfim\u2581end\uff5c>", "<MID>",
     "\u2581<MID>", "<|code_middle|>", "<|middle|>"),
)
# Texts llama.cpp makes control tokens whatever the file says (its end-of-turn and FIM
# detection), so a spelling of one in user text stays text there.
FORCED_CONTROL = frozenset({*EOG_TEXTS, *(t for names in FIM_EOG_TEXTS for t in names),
                            *(t for names in FIM_NAMES for t in names),
                            "<\uff5cend\u2581of\u2581sentence\uff5c>"})
# Added tokens convert_hf_to_gguf.py writes as control although the folder does not
# mark them special (its does_token_look_special).
LOOK_SPECIAL = frozenset({"<pad>", "<mask>", "<2mass>", "[@BOS@]"})
CONFIG_FILES = ("tokenizer_config.json", "config.json", "generation_config.json")


def looks_special(text: str) -> bool:
    """convert_hf_to_gguf.py's rule for an added token the folder forgot to mark special.

    >>> looks_special("<|im_start|>"), looks_special("<unused12>"), looks_special("<tab>")
    (True, True, False)
    """
    return (text in LOOK_SPECIAL or (text.startswith("<|") and text.endswith("|>"))
            or (text.startswith("<\uff5c") and text.endswith("\uff5c>"))
            or (text.startswith("<unused") and text.endswith(">")))


def _fix(path: Path) -> str:
    return (f"{path}: pass --model the served model's Hugging Face folder (holding"
            " tokenizer.json), its tokenizer.json, or its GGUF")


def _read_json(path: Path, *, required: bool) -> dict:
    """A JSON object from ``path``: {} when it is absent and not ``required``."""
    if not path.is_file() and not required:
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelError(f"no {path.name} in {path.parent}; {_fix(path.parent)}") from None
    except OSError as e:
        raise ModelError(f"cannot read {path} ({e.strerror}); {_fix(path)}") from None
    except (UnicodeDecodeError, ValueError) as e:
        raise ModelError(f"{path} is not valid JSON ({str(e)[:120]}); {_fix(path)}") from None
    if not isinstance(data, dict):
        raise ModelError(f"{path} holds no JSON object; {_fix(path)}")
    return data


def _token_text(value) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or ``{"content": ...}``."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _int_or_ints(value):
    """A config's token id (an int or a list of them), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int) or (isinstance(value, list) and all(
            isinstance(v, int) and not isinstance(v, bool) for v in value)):
        return value
    return None


class HFVocab:
    """The tokenizer of a Hugging Face model folder (or of its ``tokenizer.json`` alone),
    with the interface of :class:`~assistd.targets.remote.gguf_vocab.LlamaVocab` and its
    semantics (llama.cpp's, ``special=False``):

    - ``n_vocab``: the config's ``vocab_size`` where larger than the tokenizer (ids it
      lacks are spelled ``[PAD<id>]``, as convert_hf_to_gguf.py writes them);
    - ``fingerprint``: over each id's vocabulary text (``"Ġdef"``), as LlamaVocab's (an
      added token that is no control token with its ``▁`` as spaces, as
      convert_hf_to_gguf.py writes it);
    - ``bos_token_id``, ``add_bos``: tokenizer_config.json's ``bos_token`` and
      ``add_bos_token``, else config.json's id and what the post-processor adds;
    - ``eos_token_ids``: the configs' EOS ids plus llama.cpp's end-of-generation texts
      (:func:`assistd.targets.vocab.eog_ids`).

    ``path``: the folder, or its ``tokenizer.json``. Raises :class:`ModelError` for a
    path that is missing, a folder without ``tokenizer.json``, a file that is not JSON or
    a configuration file that is not, and a tokenizer the library cannot read.
    """

    def __init__(self, path: Path | str):
        path = Path(path).expanduser()
        if path.is_dir():
            folder, file = path, path / TOKENIZER_FILE
        elif path.is_file():
            folder, file = path.parent, path
        else:
            raise ModelError(f"tokenizer not found: {_fix(path)}")
        spec = _read_json(file, required=True)
        configs = {name: _read_json(folder / name, required=False) for name in CONFIG_FILES}
        from tokenizers import Tokenizer, decoders

        added = spec.get("added_tokens")
        if not isinstance(spec.get("model"), dict) or not isinstance(added, list):
            raise ModelError(f"{file} is not a Hugging Face tokenizer (no model or"
                             f" added_tokens); {_fix(path)}")
        try:
            enc = Tokenizer.from_str(json.dumps(spec))
        except Exception as e:  # noqa: BLE001 - the library raises its own Exception
            raise ModelError(f"cannot load the tokenizer {file} ({str(e)[:160]});"
                             f" {_fix(path)}") from None
        self.folder = folder
        self._configs = configs
        tok_cfg, model_cfg = configs["tokenizer_config.json"], configs["config.json"]
        text_cfg = model_cfg.get("text_config")  # a multimodal model's language model
        text_cfg = text_cfg if isinstance(text_cfg, dict) else {}
        declared = _int_or_ints(model_cfg.get("vocab_size", text_cfg.get("vocab_size")))
        size = enc.get_vocab_size(with_added_tokens=True)
        self.n_vocab = max(size, declared) if isinstance(declared, int) else size
        texts = [enc.id_to_token(i) for i in range(self.n_vocab)]
        texts = [f"[PAD{i}]" if t is None else t for i, t in enumerate(texts)]
        adds = enc.get_added_tokens_decoder()
        control = {i for i, a in adds.items() if a.special or looks_special(a.content)}
        for i, a in adds.items():  # the GGUF spells a user-defined token's "▁" as a space
            if i not in control and i < self.n_vocab:
                texts[i] = a.content.replace("\u2581", " ")
        control |= {i for i, t in enumerate(texts) if t in FORCED_CONTROL}
        self._texts = texts
        self.fingerprint = tokenizer_fingerprint(t.encode("utf-8") for t in texts)
        self._special = frozenset(i for i in control if i < self.n_vocab)
        if any(not adds[i].special for i in control if i in adds):
            # llama.cpp reads these as control tokens: special here too, so that the
            # encoder below leaves their spellings in text as text.
            for entry in added:
                if isinstance(entry, dict) and entry.get("id") in control:
                    entry["special"] = True
            enc = Tokenizer.from_str(json.dumps(spec))
        enc.encode_special_tokens = True  # control spellings in text are text (special=False)
        self._encoder = enc
        byte_level = isinstance(enc.decoder, decoders.ByteLevel)
        self._piece_bytes = [piece_bytes(t, byte_level=byte_level, special=i in self._special)
                             for i, t in enumerate(texts)]
        self._spelled = {i: piece_bytes(texts[i], byte_level=byte_level, special=False)
                         for i in self._special}
        self.bos_token_id = self._id_of(tok_cfg.get("bos_token"),
                                        model_cfg.get("bos_token_id", text_cfg.get("bos_token_id")))
        add_bos = tok_cfg.get("add_bos_token")
        if not isinstance(add_bos, bool):  # what the post-processor adds
            add_bos = self.bos_token_id is not None and enc.encode(
                "a", add_special_tokens=True).ids[:1] == [self.bos_token_id]
        self.add_bos = add_bos and self.bos_token_id is not None
        gen_cfg = configs["generation_config.json"]
        self.eos_token_ids = eog_ids(
            SimpleNamespace(eos_token_id=self._id_of(tok_cfg.get("eos_token"), None)),
            SimpleNamespace(
                config=SimpleNamespace(eos_token_id=_int_or_ints(
                    model_cfg.get("eos_token_id", text_cfg.get("eos_token_id")))),
                generation_config=SimpleNamespace(eos_token_id=_int_or_ints(
                    gen_cfg.get("eos_token_id")))),
            texts)

    def _id_of(self, text_value, id_value) -> int | None:
        """A special token's id: from its text (tokenizer_config.json), else the config's
        id, as convert_hf_to_gguf.py reads them."""
        text = _token_text(text_value)
        found = self._encoder.token_to_id(text) if text else None
        if found is None and isinstance(_int_or_ints(id_value), int):
            found = id_value
        return found if found is not None and 0 <= found < self.n_vocab else None

    def tokenize(self, text: str) -> list[int]:
        """``text`` -> ids: no BOS, control-token spellings as plain text."""
        return self._encoder.encode(encodable(text), add_special_tokens=False).ids

    def detokenize(self, ids: Sequence[int], prev: Sequence[int] | None = None) -> str:
        """Concatenated piece bytes (control tokens render as nothing), decoded as UTF-8
        (invalid bytes -> U+FFFD); a space right after a leading BOS is dropped, as
        llama.cpp does. ``prev`` does not change the text (pieces carry their spaces)."""
        ids = [int(i) for i in ids]
        data = b"".join(self._piece_bytes[i] for i in ids)
        if ids and ids[0] == self.bos_token_id and data[:1] == b" ":
            data = data[1:]
        return data.decode("utf-8", errors="replace")

    def text_of(self, ids: Sequence[int]) -> str:
        """``ids`` as the text a server's tokenizer (special tokens parsed) gives back:
        control tokens spelled out, unlike :meth:`detokenize`."""
        data = b"".join(self._spelled.get(i) or self._piece_bytes[i] for i in map(int, ids))
        return data.decode("utf-8", errors="replace")

    def pieces(self) -> list[bytes]:
        """Each id's vocabulary text as UTF-8 (``b"\\xc4\\xa0def"`` for ``"Ġdef"``)."""
        return [t.encode("utf-8") for t in self._texts]

    def special_ids(self) -> frozenset[int]:
        """The control tokens: added tokens marked special, those convert_hf_to_gguf.py
        takes for special (:func:`looks_special`), and llama.cpp's by text."""
        return self._special

    def fim_tokens(self) -> tuple[int, int, int] | None:
        """``(prefix, suffix, middle)`` ids by llama.cpp's marker names, or None."""
        by_text = {}
        for i, t in enumerate(self._texts):
            by_text.setdefault(t, i)
        ids = [next((by_text[n] for n in names if n in by_text), None) for names in FIM_NAMES]
        return tuple(ids) if None not in ids else None

    def chat_template(self) -> str | None:
        """The folder's ``chat_template.jinja``, else tokenizer_config.json's
        ``chat_template`` (a string, or the one named ``default`` of a list); None."""
        try:
            return (self.folder / "chat_template.jinja").read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            pass
        value = self._configs.get("tokenizer_config.json", {}).get("chat_template")
        if isinstance(value, list):
            value = next((t.get("template") for t in value
                          if isinstance(t, dict) and t.get("name") == "default"), None)
        return value if isinstance(value, str) else None

    def close(self) -> None:
        """Nothing to release (the tokenizer is plain memory)."""
