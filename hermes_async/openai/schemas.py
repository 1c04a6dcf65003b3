"""Request bodies as msgspec structs, and their mapping to :class:`SamplingParams`.

Unknown fields (OpenAI's ``user``, ``store``, ``metadata``, ...) are accepted and ignored, so
any OpenAI client works unchanged. Fields that would change what is generated but are not
implemented (``suffix``, ``best_of`` other than ``n``) are refused with 400 rather than
silently ignored. Structured outputs (``response_format``, vLLM's ``structured_outputs`` and
``guided_*``) are read by :mod:`hermes_async.openai.structured`; ``logit_bias`` maps token ids
(as strings, OpenAI's shape) to biases in [-100, 100]; vLLM's ``allowed_token_ids`` and
``bad_words`` are accepted.
Decoding errors name the offending field (see :func:`hermes_async.openai.errors.validation_error`).
vLLM's extra sampling fields are accepted: ``top_k``, ``min_p``, ``repetition_penalty``,
``ignore_eos``, ``min_tokens``, ``stop_token_ids``, ``cache_salt``, ``add_special_tokens``
(unset: the engine's one raw-text rule, ``AsyncEngine.encode_text``: special tokens added).
"""

from __future__ import annotations

from typing import Annotated, Any, TypeVar

import msgspec
from msgspec import Meta

from hermes_async.openai.errors import APIError
from hermes_async.openai.structured import request_structured
from hermes_async.types import SamplingParams

PositiveInt = Annotated[int, Meta(ge=1)]
T = TypeVar("T", bound=msgspec.Struct)


def documented(low: float, high: float, *, exclusive_low: bool = False) -> Meta:
    """A range said in ``/openapi.json`` only: :class:`SamplingParams` checks it and names
    the field in its 400 (msgspec's own bound would word the error differently)."""
    return Meta(extra_json_schema={"exclusiveMinimum" if exclusive_low else "minimum": low,
                                   "maximum": high})


Penalty = Annotated[float, documented(-2, 2)]
# what completion_prompts takes (the completions' prompt in /openapi.json)
PROMPT_SCHEMA = {"anyOf": [
    {"type": "string", "minLength": 1},
    {"type": "array", "minItems": 1, "items": {"type": "string", "minLength": 1}},
    {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0}},
    {"type": "array", "minItems": 1,
     "items": {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0}}}]}


class StreamOptions(msgspec.Struct):
    """``stream_options``: ``include_usage`` adds a last chunk with ``usage``."""

    include_usage: bool = False


class _SamplingFields(msgspec.Struct, kw_only=True):
    model: str | None = None
    max_tokens: PositiveInt | None = None
    temperature: float | None = None
    top_p: float | None = None
    n: Annotated[int, documented(1, 128)] = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    logit_bias: dict[str, float] | None = None
    response_format: dict[str, Any] | None = None
    # vLLM extras
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: Annotated[float, documented(0, 10, exclusive_low=True)] | None = None
    ignore_eos: bool = False
    min_tokens: Annotated[int, Meta(ge=0)] = 0
    stop_token_ids: list[int] | None = None
    cache_salt: str | None = None
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    structured_outputs: dict[str, Any] | None = None
    guided_json: Any = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    guided_decoding_backend: str | None = None  # accepted, ignored (llguidance is the one)
    guided_whitespace_pattern: str | None = None  # accepted, ignored

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class ChatCompletionRequest(_SamplingFields, kw_only=True):
    """``POST /v1/chat/completions``. ``messages`` are validated by prompt assembly."""

    messages: list[Any]
    max_completion_tokens: PositiveInt | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Meta(ge=0, le=20)] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool = True
    add_generation_prompt: bool = True


class CompletionRequest(_SamplingFields, kw_only=True):
    """``POST /v1/completions``: ``prompt`` is a string, a list of strings, a list of token
    ids or a list of token-id lists (several prompts -> choices ``k * n + i``)."""

    prompt: str | list[Any]  # /openapi.json says PROMPT_SCHEMA
    logprobs: Annotated[int, Meta(ge=0, le=20)] | None = None
    echo: bool = False
    suffix: Annotated[str, Meta(extra_json_schema={"maxLength": 0})] | None = None  # refused
    best_of: Annotated[int, Meta(description="only equal to n")] | None = None
    add_special_tokens: bool | None = None


class TokenizeRequest(msgspec.Struct, kw_only=True):
    """``POST /tokenize`` (vLLM's shape): ``prompt`` or ``messages``."""

    model: str | None = None
    prompt: str | None = None
    messages: list[Any] | None = None
    tools: list[dict[str, Any]] | None = None
    add_special_tokens: bool | None = None
    add_generation_prompt: bool = True


class CacheWarmRequest(msgspec.Struct, kw_only=True):
    """``POST /cache/warm``: ``prompt`` (raw text or token ids) or ``messages`` (+ ``tools``),
    the ``namespace`` (default: the caller's), and ``pin_ttl_s`` to pin it."""

    model: str | None = None
    prompt: str | list[int] | None = None
    messages: list[Any] | None = None
    tools: list[dict[str, Any]] | None = None
    namespace: str | None = None
    pin_ttl_s: Annotated[float, Meta(gt=0)] | None = None


class CacheResetRequest(msgspec.Struct, kw_only=True):
    """``POST /cache/reset``: one ``namespace`` (default: the caller's); the admin may give
    ``"*"`` for every namespace."""

    namespace: str | None = None


def decode(body: bytes, type: type[T]) -> T:
    """Decode a JSON body into ``type``; raises msgspec errors (mapped to 400 upstream)."""
    return msgspec.json.decode(body, type=type)


def unsupported(param: str, message: str) -> APIError:
    """400 ``unsupported_parameter``."""
    return APIError(400, message, param=param, code="unsupported_parameter")


def completion_prompts(prompt: str | list[Any]) -> list[str | list[int]]:
    """The prompts of a completions request, each a string or a list of token ids."""
    if isinstance(prompt, str):
        return [prompt]
    if prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return [list(prompt)]
    if prompt and all(isinstance(p, str) for p in prompt):
        return list(prompt)
    if prompt and all(isinstance(p, list) and p and all(
            isinstance(t, int) and not isinstance(t, bool) for t in p) for p in prompt):
        return [list(p) for p in prompt]
    raise APIError(400, "prompt must be a string, a list of strings, a list of token ids or a "
                   "list of non-empty token-id lists", param="prompt", code="invalid_value")


def logit_bias_pairs(bias: dict[str, float] | None) -> tuple[tuple[int, float], ...]:
    """OpenAI's ``logit_bias`` (token id as a string -> bias) as sorted pairs."""
    if not bias:
        return ()
    pairs = []
    for key, value in bias.items():
        try:
            token = int(key)
        except ValueError:
            raise APIError(400, f"logit_bias keys must be token ids, got {key!r}",
                           param="logit_bias", code="invalid_value") from None
        pairs.append((token, float(value)))
    return tuple(sorted(pairs))


def structured_param(req: _SamplingFields) -> str:
    """The request field that carries its structured-output constraint (for error messages)."""
    if req.response_format is not None and req.response_format.get("type", "text") != "text":
        return "response_format"
    if req.structured_outputs is not None:
        return "structured_outputs"
    for name in ("guided_json", "guided_regex", "guided_choice", "guided_grammar"):
        if getattr(req, name) is not None:
            return name
    return "response_format"


def sampling_params(req: _SamplingFields, *, max_tokens: int | None, logprobs: bool,
                    top_logprobs: int) -> SamplingParams:
    """Map a request's OpenAI/vLLM fields to validated :class:`SamplingParams` (their
    ``InvalidParameter`` names the field and becomes a 400)."""
    stop = (req.stop,) if isinstance(req.stop, str) else tuple(req.stop or ())
    kwargs: dict[str, Any] = {
        "max_tokens": max_tokens, "n": req.n, "stop": stop, "seed": req.seed,
        "ignore_eos": req.ignore_eos, "min_tokens": req.min_tokens,
        "stop_token_ids": tuple(req.stop_token_ids or ()),
        "logprobs": logprobs, "top_logprobs": top_logprobs,
        "top_k": req.top_k if req.top_k is not None and req.top_k > 0 else None,  # vLLM: -1 off
        "logit_bias": logit_bias_pairs(req.logit_bias),
        "allowed_token_ids": (None if req.allowed_token_ids is None
                              else tuple(req.allowed_token_ids)),
        "bad_words": tuple(req.bad_words or ()),
        "structured": request_structured(req.response_format, req.structured_outputs, {
            "guided_json": req.guided_json, "guided_regex": req.guided_regex,
            "guided_choice": req.guided_choice, "guided_grammar": req.guided_grammar}),
    }
    for name in ("temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty",
                 "frequency_penalty"):
        value = getattr(req, name)
        if value is not None:
            kwargs[name] = float(value)
    return SamplingParams(**kwargs)


def chat_sampling_params(req: ChatCompletionRequest) -> SamplingParams:
    """Chat: ``max_completion_tokens`` wins over ``max_tokens``; no limit by default (up to
    the context); ``logprobs`` is a bool, ``top_logprobs`` a count."""
    max_tokens = req.max_completion_tokens or req.max_tokens
    return sampling_params(req, max_tokens=max_tokens, logprobs=req.logprobs,
                           top_logprobs=req.top_logprobs or 0)


def completion_sampling_params(req: CompletionRequest) -> SamplingParams:
    """Completions: ``max_tokens`` defaults to 16 (as OpenAI's); ``logprobs`` is a count."""
    if req.suffix:
        raise unsupported("suffix", "suffix is not supported")
    if req.best_of is not None and req.best_of != req.n:
        raise unsupported("best_of", "best_of other than n is not supported")
    if req.echo and req.logprobs is not None:
        raise unsupported("echo", "echo together with logprobs is not supported")
    return sampling_params(req, max_tokens=16 if req.max_tokens is None else req.max_tokens,
                           logprobs=req.logprobs is not None, top_logprobs=req.logprobs or 0)
