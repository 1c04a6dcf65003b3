"""What an :class:`~hermes_async.engine.async_engine.AsyncEngine` is built from.

The engine never loads a model itself: a builder (``hermes_async.builder.build_parts`` for the
Llama-family runner, or a test's fakes) hands it an :class:`EngineParts`. The engine depends on
these protocols only, never on ``hermes_async.model``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from hermes_async.config import EngineConfig
from hermes_async.step import StepRunner
from hermes_async.types import StructuredOutput

if TYPE_CHECKING:
    from hermes_async.engine.output_text import OutputText
    from hermes_async.engine.request import CompiledConstraint
    from hermes_async.prompt import PromptAssembler


class Tokenizer(Protocol):
    """The tokenizer calls the engine and its front ends make (a transformers tokenizer)."""

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = ...) -> str: ...


class GrammarCompiler(Protocol):
    """Compiles structured-output constraints (``hermes_async.grammar.GrammarCompiler``)."""

    async def compile(self, structured: StructuredOutput,
                      param: str = ...) -> CompiledConstraint:
        """Compiled (cached); raises ``InvalidParameter`` naming ``param`` when invalid."""
        ...

    def stats(self) -> Any:
        """Cache figures with an ``as_dict()`` (hits, misses, failures, size, ...)."""
        ...


OutputTextFactory = Callable[[list[int], tuple[str, ...]], "OutputText"]
"""``(prompt_ids, stop_strings) -> OutputText``: one per generated sequence."""


@dataclass(frozen=True)
class EngineParts:
    """A runner with its tokenizer, EOS ids, output-text factory and (optional) chat assembler.

    ``assembler`` None: the engine takes raw text and token ids only (no chat messages).
    ``model_dir`` is reported by ``/v1/models``. ``grammars`` None: structured outputs are
    refused (400).
    """

    runner: StepRunner
    tokenizer: Tokenizer
    eos_token_ids: frozenset[int]
    output_text: OutputTextFactory
    assembler: PromptAssembler | None = None
    model_dir: Path | None = None
    grammars: GrammarCompiler | None = None


PartsLoader = Callable[[EngineConfig], EngineParts]
"""Builds the parts for a config; blocking (the engine calls it in its worker thread)."""
