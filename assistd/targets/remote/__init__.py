"""A remote Target: an OpenAI-compatible inference server (llama.cpp's or
llama-cpp-python's server, vLLM) that assistd sends its prompts to.

The server decodes; assistd does not verify drafts against it (docs/design.md,
"Remote Target"), so :attr:`RemoteTarget.speculation_off` is set and the runtime sends
each generation to ``POST /v1/completions`` with ``stream: true`` instead of running the
speculative loop. History, scopes, prompts and the front ends stay local. What a prompt
carries: the document's text, and with ``context="all"`` cross-file snippets of the
scope's other open buffers, which have passed the history's secret filter
(editors/crossfile.py); nothing from the history itself (a remote Target does not
draft, so no scope is read).

One job per module:

- :mod:`.target`: :class:`RemoteTarget`, its settings and health (``status``);
- :mod:`.network`: the URL, TLS, the key's header, capped requests, error messages;
- :mod:`.auth`: the key (:func:`read_key`: a 0600 file or ``$ASSISTD_TARGET_KEY``);
- :mod:`.errors`: :class:`RemoteTargetError`; the server's text made fit to show
  (:func:`printable`, :func:`redact_key`);
- :mod:`.tokenizer`: the tokenizer found (a GGUF's vocabulary, the server's, characters);
- :mod:`.gguf_vocab`: a GGUF's vocabulary without its weights;
- :mod:`.prompts`: the prompt as ids or as text with control tokens defused;
- :mod:`.fim`: fill-in-the-middle markers;
- :mod:`.generation`: one streamed completion, its limits, retries and ledger;
- :mod:`.stream`: the server-sent events, read on a thread through byte caps.

Every read from the server is capped in bytes (an event line ``MAX_LINE_BYTES``, a
stream ``MAX_STREAM_BYTES``, an answer's body ``MAX_BODY_BYTES``, an error's body
``MAX_ERROR_BYTES``) and in time (a deadline per generation); what the server says has
the key replaced and its control characters escaped before it reaches a message, the
log, ``status`` or the API.
"""

from assistd.targets.remote.auth import KEY_ENV, read_key
from assistd.targets.remote.errors import RemoteTargetError, printable, redact_key
from assistd.targets.remote.fim import FIM_FAMILIES, FIM_SETTINGS
from assistd.targets.remote.generation import (DEADLINE_TOKENS_PER_S, MAX_TOKEN_CHARS, RETRIES,
                                               RemoteLedger, RemoteResult)
from assistd.targets.remote.network import (MAX_BODY_BYTES, MAX_ERROR_BYTES, base_url,
                                            is_this_machine)
from assistd.targets.remote.prompts import defuse
from assistd.targets.remote.stream import MAX_LINE_BYTES, MAX_STREAM_BYTES
from assistd.targets.remote.target import CONTEXT_SETTINGS, RemoteTarget

__all__ = [
    "CONTEXT_SETTINGS", "DEADLINE_TOKENS_PER_S", "FIM_FAMILIES", "FIM_SETTINGS", "KEY_ENV",
    "MAX_BODY_BYTES", "MAX_ERROR_BYTES", "MAX_LINE_BYTES", "MAX_STREAM_BYTES",
    "MAX_TOKEN_CHARS", "RETRIES", "RemoteLedger", "RemoteResult", "RemoteTarget",
    "RemoteTargetError", "base_url", "defuse", "is_this_machine", "printable", "read_key",
    "redact_key",
]
