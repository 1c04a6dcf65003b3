"""Wiring: the one place that puts a model, a tokenizer and prompt assembly behind an engine.

``AsyncEngine.start()`` calls :func:`build_components` (in its worker thread: loading takes
seconds) when no runner was injected; the server and the CLI go through the same function.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hermes_async.config import EngineConfig


@dataclass
class Components:
    runner: Any  # hermes_async.model.executor.StepExecutor
    tokenizer: Any
    eos_token_ids: list[int]
    encode_messages: Callable[[list[dict]], list[int]]
    output_text: Callable[..., Any]
    assembler: Any
    model_dir: Path


def eos_ids_of(model_dir: Path, tokenizer: Any) -> list[int]:
    """EOS ids from the generation config (an int or a list), else the tokenizer's."""
    from transformers import GenerationConfig

    try:
        eos = GenerationConfig.from_pretrained(str(model_dir)).eos_token_id
    except OSError:  # no generation_config.json
        eos = None
    if eos is None:
        eos = getattr(tokenizer, "eos_token_id", None)
    if eos is None:
        return []
    return [eos] if isinstance(eos, int) else list(eos)


def build_components(config: EngineConfig) -> Components:
    """Resolve the model directory (the embedded default when unset), load tokenizer, runner,
    sampler and prompt assembler."""
    from transformers import AutoTokenizer

    from hermes_async.engine.async_engine import output_text_factory
    from hermes_async.model.default_model import resolve_model_path
    from hermes_async.model.executor import StepExecutor
    from hermes_async.model.runner import ModelRunner
    from hermes_async.prompt import AssemblyCache, PromptAssembler

    model_dir = resolve_model_path(config.model.path)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    runner = StepExecutor(ModelRunner(model_dir, config.model, config.cache))
    assembler = PromptAssembler(tokenizer, cache=AssemblyCache(), model_id=str(model_dir))

    def encode_messages(messages: list[dict]) -> list[int]:
        return list(assembler.assemble(messages).token_ids)

    return Components(runner, tokenizer, eos_ids_of(model_dir, tokenizer), encode_messages,
                      output_text_factory(tokenizer), assembler, model_dir)
