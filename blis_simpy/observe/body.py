"""What ``observe`` sends: the endpoint and the JSON body of one OpenAI-style request.

* ``completions`` → ``POST <server>/v1/completions`` with ``prompt`` = the request's prompt
  token IDs (a list of ints; vLLM and other OpenAI-compatible servers accept token-ID
  prompts), so prompt lengths and shared prefixes reach the server exactly.
* ``chat`` → ``POST <server>/v1/chat/completions`` with one user message whose text is
  synthesised from the token IDs: each ID becomes one common English word
  (``WORDS[id % len(WORDS)]``). The same IDs always give the same text, so shared prefixes
  stay shared, but the server's tokenizer and chat template decide the real prompt length:
  token counts are approximate (the server's ``usage.prompt_tokens`` is recorded).

The output budget is ``max_tokens`` = the request's ``max_output_len`` (at least 1: servers
refuse 0); with ``server_type == "vllm"`` also ``min_tokens`` = the same and
``ignore_eos: true``, so vLLM generates exactly that many tokens. ``unconstrained_output``
leaves all three out (the server stops where the model stops). Streaming bodies ask for
``stream_options: {include_usage: true}`` so the last chunk carries the token counts.
"""

from __future__ import annotations

from collections.abc import Sequence

COMPLETIONS, CHAT = "completions", "chat"
API_FORMATS = (COMPLETIONS, CHAT)
PATHS = {COMPLETIONS: "/v1/completions", CHAT: "/v1/chat/completions"}

#: Common English words, one (space-prefixed) token each in the usual BPE vocabularies.
WORDS: tuple[str, ...] = tuple("""
the of and to in is it you that he was for on are with as his they be at one have this from
or had by word but what some we can out other were all there when up use your how said an
each she which do their time if will way about many then them write would like so these her
long make thing see him two has look more day could go come did number sound no most people
my over know water than call first who may down side been now find any new work part take
get place made live where after back little only round man year came show every good me give
our under name very through just form sentence great think say help low line differ turn
cause much mean before move right boy old too same tell does set three want air well also
play small end put home read hand port large spell add even land here must big high such
follow act why ask men change went light kind off need house picture try us again animal
point mother world near build self earth father head stand own page should country found
answer school grow study still learn plant cover food sun four between state keep eye never
last let thought city tree cross farm hard start might story saw far sea draw left late run
while press close night real life few north open seem together next white children begin got
walk example ease paper group always music those both mark often letter until mile river car
feet care second book carry took science eat room friend began idea fish mountain stop once
base hear horse cut sure watch color face wood main enough plain girl usual young ready above
ever red list though feel talk bird soon body dog family direct pose leave song measure door
""".split())


def endpoint_path(api_format: str) -> str:
    """``/v1/completions`` or ``/v1/chat/completions``."""
    return PATHS[api_format]


def endpoint_url(server_url: str, api_format: str) -> str:
    """The full URL: ``server_url`` without a trailing ``/`` or ``/v1``, then the path."""
    base = server_url.rstrip("/")
    if base.endswith("/v1"):
        base = base[:-3]
    return base + endpoint_path(api_format)


def chat_text(token_ids: Sequence[int]) -> str:
    """The deterministic chat message for ``token_ids`` (one word per ID)."""
    words = WORDS
    n = len(words)
    return " ".join(words[int(t) % n] for t in token_ids)


def request_body(token_ids: Sequence[int], max_output_tokens: int, *, model: str, api_format: str,
                 streaming: bool = True, server_type: str = "vllm",
                 unconstrained_output: bool = False) -> dict:
    """The JSON body of one request (see the module docstring)."""
    body: dict = {"model": model}
    if api_format == CHAT:
        body["messages"] = [{"role": "user", "content": chat_text(token_ids)}]
    else:
        body["prompt"] = [int(t) for t in token_ids]
    if not unconstrained_output:
        n = max(int(max_output_tokens), 1)
        body["max_tokens"] = n
        if server_type == "vllm":
            body["min_tokens"] = n
            body["ignore_eos"] = True
    body["stream"] = streaming
    if streaming:
        body["stream_options"] = {"include_usage": True}
    return body
