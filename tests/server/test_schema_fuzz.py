"""Schema fuzzing with schemathesis against a live server on a tiny random-weight model (the
default model's tokenizer and chat template, random 2-layer weights): every request generated
from ``/openapi.json`` -- valid ones and broken ones -- gets no 5xx, an OpenAI error object with
a documented status when it fails, and an answer that conforms to the document."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from hermes_async.config import CacheConfig, EngineConfig, ModelConfig, ServerConfig
from tests.server.helpers import ServerThread, request_json

EXAMPLES = 40  # per operation and generation mode: bounded (about a minute in all)


def make_tiny_chat_model(path: Path, tokenizer_dir: Path) -> Path:
    """Random weights at the default model's vocabulary, with its tokenizer and template."""
    import torch
    import transformers as tf

    torch.manual_seed(0)
    cfg = tf.LlamaConfig(vocab_size=49152, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                         head_dim=32, max_position_embeddings=2048, tie_word_embeddings=True,
                         bos_token_id=1, eos_token_id=2, pad_token_id=2)
    tf.LlamaForCausalLM(cfg).save_pretrained(path)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (tokenizer_dir / name).exists():
            shutil.copy(tokenizer_dir / name, path / name)
    return path


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory: pytest.TempPathFactory, default_model_dir: Path):
    model = make_tiny_chat_model(tmp_path_factory.mktemp("tiny-chat"), default_model_dir)
    cfg = EngineConfig(model=ModelConfig(path=str(model), dtype="float32", device="cpu",
                                         max_model_len=128),
                       cache=CacheConfig(kv_cache_bytes=32 << 20),
                       server=ServerConfig(max_body_bytes=1 << 20))
    srv = ServerThread(cfg).start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def api_schema(fuzz_server: Any) -> Any:
    root = fuzz_server.base_url.removesuffix("/v1")
    return schemathesis.openapi.from_url(f"{root}/openapi.json")


CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance,
          response_schema_conformance]


def _bounded(case: Any) -> Any:
    """Valid generation requests with ``n`` up to 128 and ``max_tokens`` up to the context
    take seconds each on 2 cores: cap them (the caps are valid values too)."""
    body = case.body
    if isinstance(body, dict):
        for key, cap in (("n", 2), ("max_tokens", 16), ("max_completion_tokens", 16)):
            value = body.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > cap:
                body[key] = cap
        if isinstance(body.get("prompt"), list) and len(body["prompt"]) > 4:
            body["prompt"] = body["prompt"][:4]  # each prompt is a request of its own
    return case


def _fuzz(operation: Any, mode: GenerationMode, root: str) -> dict[int, int]:
    """Run the operation's cases; returns how many answers of each status it got."""
    statuses: dict[int, int] = {}

    @given(case=operation.as_strategy(generation_mode=mode).map(_bounded))
    @settings(max_examples=EXAMPLES, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    def run(case: Any) -> None:
        response = case.call(base_url=root, timeout=60)
        statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
        case.validate_response(response, checks=CHECKS)
        if response.status_code >= 400:
            assert set(response.json()["error"]) == {"message", "type", "param", "code"}

    try:
        run()
    except Unsatisfiable:  # negative mode: an operation without inputs has nothing to break
        assert mode is GenerationMode.NEGATIVE, operation.label
    return statuses


@pytest.mark.parametrize("mode", list(GenerationMode), ids=str)
def test_api_never_answers_5xx_and_conforms(api_schema: Any, fuzz_server: Any,
                                             mode: GenerationMode) -> None:
    root = fuzz_server.base_url.removesuffix("/v1")
    operations = [r.ok() for r in api_schema.get_all_operations()]
    assert len(operations) >= 9, [o.label for o in operations]
    seen = {op.label: _fuzz(op, mode, root) for op in operations}
    print(seen)
    if mode is GenerationMode.POSITIVE:  # valid requests do generate
        assert seen["POST /v1/chat/completions"].get(200, 0) > 0
        assert seen["POST /v1/completions"].get(200, 0) > 0


def test_server_is_healthy_and_idle_after_fuzzing(fuzz_server: Any) -> None:
    root = fuzz_server.base_url.removesuffix("/v1")
    assert request_json(f"{root}/health")[0] == 200
    from tests.server.helpers import engine_idle

    idle = fuzz_server.call(lambda: engine_idle(fuzz_server.engine))
    assert idle == {"requests": 0, "running": 0, "waiting": 0, "pinned": 0, "private": 0}
    fuzz_server.call(fuzz_server.engine.check_integrity)
