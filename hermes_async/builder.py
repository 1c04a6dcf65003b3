"""The builder: puts a model, its tokenizer and prompt assembly behind an engine.

The one place that wires ``hermes_async.model`` (torch) to ``hermes_async.engine`` (which never
imports it). :func:`build_parts` resolves the model directory (the embedded default when
unset), loads the tokenizer, the runner with its sampler and the chat assembler, and returns
typed :class:`~hermes_async.engine.parts.EngineParts`. :class:`AsyncEngine` is the engine with
this builder as its loader: the public ``hermes_async.AsyncEngine``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hermes_async.config import EngineConfig, StructuredConfig
from hermes_async.engine.async_engine import AsyncEngine as _EngineBase
from hermes_async.engine.front import PromptFront
from hermes_async.engine.parts import EngineParts, PartsLoader


def eos_ids_of(model_dir: Path, tokenizer: Any) -> frozenset[int]:
    """EOS ids from the generation config (an int or a list), else the tokenizer's."""
    from transformers import GenerationConfig

    try:
        eos = GenerationConfig.from_pretrained(str(model_dir)).eos_token_id
    except OSError:  # no generation_config.json
        eos = None
    if eos is None:
        eos = getattr(tokenizer, "eos_token_id", None)
    if eos is None:
        return frozenset()
    return frozenset([eos] if isinstance(eos, int) else eos)


def grammar_compiler(tokenizer: Any, vocab_size: int, tokenizer_id: str,
                     config: StructuredConfig | None = None) -> Any:
    """The structured-output compiler over a transformers tokenizer, its masks as wide as the
    model's logits (``vocab_size``)."""
    import llguidance.hf

    from hermes_async.grammar import GrammarCompiler, JsonOptions

    cfg = config or StructuredConfig()
    ll_tokenizer = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size)
    return GrammarCompiler(ll_tokenizer, tokenizer_id, cfg.grammar_cache_size,
                           JsonOptions(cfg.json_fraction_digits, cfg.json_integer_digits))


@dataclass(frozen=True)
class Front:
    """A model's prompt side without its weights: what :func:`build_front` loads."""

    front: PromptFront
    model_dir: Path
    vocab_size: int


def build_front(config: EngineConfig, vocab_size: int | None = None) -> Front:
    """The tokenizer, chat assembler and grammar compiler of ``config``'s model, without its
    weights (blocking: about a second); ``vocab_size`` defaults to the model config's. The Ray
    Serve ingress assembles and tokenizes with it before routing."""
    from hermes_async.model.default_model import resolve_model_path
    from hermes_async.model.spec import read_spec
    from hermes_async.model.tokenizer import load_tokenizer
    from hermes_async.prompt import AssemblyCache, PromptAssembler

    model_dir = resolve_model_path(config.model.path)
    tokenizer = load_tokenizer(model_dir)
    vocab = vocab_size if vocab_size is not None else read_spec(model_dir).vocab_size
    assembler = PromptAssembler(tokenizer, cache=AssemblyCache(), model_id=str(model_dir))
    grammars = grammar_compiler(tokenizer, vocab, str(model_dir), config.structured)
    return Front(PromptFront(tokenizer, assembler, grammars, config.structured), model_dir,
                 vocab)


def build_parts(config: EngineConfig) -> EngineParts:
    """Load everything an engine runs on for ``config`` (blocking: seconds)."""
    from hermes_async.engine.output_text import output_text_factory
    from hermes_async.model.default_model import resolve_model_path
    from hermes_async.model.executor import StepExecutor
    from hermes_async.model.runner import ModelRunner

    model_dir = resolve_model_path(config.model.path)
    model_runner = ModelRunner(model_dir, config.model, config.cache)
    loaded = build_front(config, model_runner.vocab_size)
    front = loaded.front
    return EngineParts(StepExecutor(model_runner), front.tokenizer,
                       eos_ids_of(model_dir, front.tokenizer),
                       output_text_factory(front.tokenizer), front.assembler, model_dir,
                       front.grammars)


class AsyncEngine(_EngineBase):
    """The engine with the default builder: ``AsyncEngine(EngineConfig())`` loads the model
    of ``config.model.path`` (the embedded SmolLM2-135M-Instruct when unset) at ``start()``.
    Injected parts (``runner=``, ``tokenizer=``, ...) or another ``loader=`` take precedence."""

    def __init__(self, config: EngineConfig | None = None, *,
                 loader: PartsLoader | None = None, **kwargs: Any) -> None:
        super().__init__(config, loader=loader or build_parts, **kwargs)
