"""Engine factories for the Ray tests' replicas (``build_app(config, "tests.scale.fake_engine:
build")``): the torch-free FakeRunner behind the default model's tokenizer (the ingress
assembles with the same one), so a replica starts in about a second."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from hermes_async.config import EngineConfig
from hermes_async.engine.async_engine import AsyncEngine
from hermes_async.step import SampledToken, SequenceStep
from tests.engine.fake_runner import EOS, FakeRunner, fake_output_text


@dataclass
class SlowFakeRunner(FakeRunner):
    """A FakeRunner whose every step takes ``step_s`` (requests stay in flight a while)."""

    step_s: float = 0.02

    def execute(self, steps: Sequence[SequenceStep]) -> list[SampledToken | None]:
        time.sleep(self.step_s)
        return super().execute(steps)


def _engine(config: EngineConfig, runner: FakeRunner) -> AsyncEngine:
    from transformers import AutoTokenizer

    from hermes_async.model.default_model import resolve_model_path

    tokenizer = AutoTokenizer.from_pretrained(str(resolve_model_path(config.model.path)))
    return AsyncEngine(config, runner=runner, tokenizer=tokenizer, eos_token_ids=[EOS],
                       output_text=fake_output_text)


def build(config: EngineConfig) -> AsyncEngine:
    """A fast fake engine: 4-token blocks, 2048 of them."""
    return _engine(config, FakeRunner(block_size=4, num_blocks=2048, max_model_len=1024))


def build_slow(config: EngineConfig) -> AsyncEngine:
    """A fake engine whose steps take 20 ms."""
    return _engine(config, SlowFakeRunner(block_size=4, num_blocks=2048, max_model_len=1024))
