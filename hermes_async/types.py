"""Plain data shared by the layers (stdlib only: no torch, no asyncio): sampling parameters,
finish reasons and the parameter error. The step protocol is in ``hermes_async.step``.
Nothing here knows about HTTP or JSON.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class GuideKind(StrEnum):
    """What a :class:`StructuredOutput` constrains the output to."""

    JSON = "json"  # a JSON schema (``{}`` or ``{"type": "object"}`` for plain JSON objects)
    REGEX = "regex"  # a regular expression over the whole output
    CHOICE = "choice"  # exactly one of a list of strings
    GRAMMAR = "grammar"  # a Lark grammar (llguidance's dialect; GBNF is converted)


@dataclass(frozen=True)
class StructuredOutput:
    """A constraint on the generated text, enforced token by token by the grammar engine.

    spec: the canonical text of the constraint: a JSON schema serialised with sorted keys, a
        regex, a JSON list of the choices, or a grammar's text. It is the compiled-grammar
        cache's key (with ``kind``), so equal constraints compile once.
    """

    kind: GuideKind
    spec: str


class FinishReason(StrEnum):
    """Why a sequence stopped, spelled as OpenAI does (plus ``abort`` and ``error``)."""

    STOP = "stop"  # EOS, a stop token id or a stop string
    LENGTH = "length"  # max_tokens or the model's context
    ABORT = "abort"  # the client went away or abort() was called
    ERROR = "error"  # the step that computed it failed


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens and when to stop (OpenAI's names and meanings).

    temperature 0 means greedy. ``top_k`` None and ``top_p`` 1.0 and ``min_p`` 0 disable those
    filters. Penalties follow OpenAI (frequency/presence, additive on logits) and the HF/vLLM
    repetition penalty (divides positive logits, multiplies negative ones, over prompt and
    output tokens). ``seed`` makes a request's samples reproducible whatever else is batched
    with it. ``stop`` strings never appear in the output. ``n`` sequences share the prompt's
    KV blocks. ``top_logprobs`` > 0 implies ``logprobs``.

    ``logit_bias`` (OpenAI): ``(token id, bias in [-100, 100])`` pairs added to the logits
    before penalties' bans and sampling. ``allowed_token_ids`` (vLLM): when set, every other id
    is banned. ``bad_words`` (vLLM): strings whose token sequences are never completed (the
    engine bans a sequence's last token when the output ends with the rest of it).
    ``structured``: the output must match this constraint (JSON schema, regex, choice, grammar).
    """

    max_tokens: int | None = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    min_tokens: int = 0
    n: int = 1
    logprobs: bool = False
    top_logprobs: int = 0
    logit_bias: tuple[tuple[int, float], ...] = ()
    allowed_token_ids: tuple[int, ...] | None = None
    bad_words: tuple[str, ...] = ()
    structured: StructuredOutput | None = None

    def __post_init__(self) -> None:
        checks = [
            (self.max_tokens is None or self.max_tokens >= 1, "max_tokens", "must be >= 1"),
            (0.0 <= self.temperature <= 100.0, "temperature", "must be in [0, 100]"),
            (0.0 < self.top_p <= 1.0, "top_p", "must be in (0, 1]"),
            (self.top_k is None or self.top_k >= 1, "top_k", "must be >= 1"),
            (0.0 <= self.min_p <= 1.0, "min_p", "must be in [0, 1]"),
            (0.0 < self.repetition_penalty <= 10.0, "repetition_penalty", "must be in (0, 10]"),
            (-2.0 <= self.frequency_penalty <= 2.0, "frequency_penalty", "must be in [-2, 2]"),
            (-2.0 <= self.presence_penalty <= 2.0, "presence_penalty", "must be in [-2, 2]"),
            (1 <= self.n <= 128, "n", "must be in [1, 128]"),
            (0 <= self.top_logprobs <= 20, "top_logprobs", "must be in [0, 20]"),
            (self.min_tokens >= 0, "min_tokens", "must be >= 0"),
            (len(self.stop) <= 16 and all(isinstance(s, str) and s for s in self.stop),
             "stop", "must be at most 16 non-empty strings"),
            (len(self.logit_bias) <= 1024 and all(
                -100.0 <= b <= 100.0 for _, b in self.logit_bias), "logit_bias",
             "must map at most 1024 token ids to biases in [-100, 100]"),
            (self.allowed_token_ids is None or len(self.allowed_token_ids) >= 1,
             "allowed_token_ids", "must list at least one token id"),
            (len(self.bad_words) <= 128 and all(isinstance(w, str) and w for w in self.bad_words),
             "bad_words", "must be at most 128 non-empty strings"),
        ]
        for ok, name, why in checks:
            if not ok:
                raise InvalidParameter(name, f"{name} {why}")
        if self.top_logprobs and not self.logprobs:
            object.__setattr__(self, "logprobs", True)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


class InvalidParameter(ValueError):
    """A request parameter is out of range; ``param`` names it (the server's 400 ``param``).

    ``code`` is an optional machine-readable reason (the OpenAI error object's ``code``), e.g.
    ``context_length_exceeded``; ``None`` lets the server pick its generic code.
    """

    def __init__(self, param: str, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.param = param
        self.code = code
