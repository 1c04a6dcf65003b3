"""Unit tests of the server's pieces: config, CLI flag merging, auth and namespaces, request
schemas and their mapping, the error mapping, SSE framing."""

from __future__ import annotations

import argparse
import dataclasses
import gc
from pathlib import Path

import msgspec
import pytest

from hermes_async.cli.serve import build_config, freeze_startup_heap
from hermes_async.config import ConfigError, EngineConfig, ServerConfig, from_dict, load
from hermes_async.engine.errors import EngineError, NamespaceBusyError, QueueFullError
from hermes_async.openai.auth import Authenticator, is_protected, namespace_for
from hermes_async.openai.errors import APIError, to_api_error
from hermes_async.openai.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    chat_sampling_params,
    completion_prompts,
    completion_sampling_params,
    decode,
)
from hermes_async.openai.sse import DONE, KEEPALIVE, event
from hermes_async.prompt import PromptError
from hermes_async.types import InvalidParameter

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


# ----- config -----------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["default", "cpu-small", "multi-tenant", "gpu"])
def test_shipped_configs_load(name):
    cfg = load(CONFIGS / f"{name}.toml")
    assert isinstance(cfg.server, ServerConfig)
    if name == "multi-tenant":
        assert set(cfg.server.api_keys.values()) == {"team-a", "team-b", "batch"}


def test_default_toml_documents_every_server_key():
    text = (CONFIGS / "default.toml").read_text()
    for f in dataclasses.fields(ServerConfig):
        assert f.name in text, f.name


def test_default_toml_documents_every_ray_key():
    from hermes_async.config import RayConfig

    text = (CONFIGS / "default.toml").read_text().split("[ray]", 1)[1]
    for f in dataclasses.fields(RayConfig):
        assert f.name in text, f.name


def test_server_config_validation_and_secret_repr():
    cfg = from_dict({"server": {"api_keys": {"sk-1": "team-a"}, "port": 0}})
    assert cfg.server.api_keys == {"sk-1": "team-a"} and "sk-1" not in repr(cfg)
    for bad in ({"api_keys": {"k": "a~b"}}, {"api_keys": {"k k": "a"}}, {"port": 70000},
                {"max_body_bytes": 10}, {"request_timeout_s": 0}, {"bogus": 1}):
        with pytest.raises(ConfigError):
            from_dict({"server": bad})


def test_cli_flags_over_file_over_defaults(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[model]\ndtype = "bfloat16"\n[server]\nport = 9000\nhost = "0.0.0.0"\n'
                    '[server.api_keys]\n"sk-x" = "team-x"\n')

    def args(**kw):
        base = dict(config=None, model=None, dtype=None, host=None, port=None, api_key=None,
                    replicas=None, ray=False, ray_address=None)
        return argparse.Namespace(**{**base, **kw})

    assert build_config(args()) == EngineConfig()
    cfg = build_config(args(config=str(path)))
    assert (cfg.model.dtype, cfg.server.port, cfg.server.host) == ("bfloat16", 9000, "0.0.0.0")
    cfg = build_config(args(config=str(path), port=0, dtype="float32", model="/m",
                            api_key="sk-cli"))
    assert (cfg.model.dtype, cfg.model.path, cfg.server.port) == ("float32", "/m", 0)
    assert cfg.server.api_keys == {"sk-x": "team-x", "sk-cli": "default"}
    assert cfg.server.host == "0.0.0.0"
    cfg = build_config(args(replicas=3, ray_address="10.0.0.1:6379"))
    assert (cfg.ray.replicas, cfg.ray.address) == (3, "10.0.0.1:6379")
    cfg = build_config(args(config=str(path), kv_cache_dir="/var/kv"))
    assert cfg.cache.disk_dir == "/var/kv" and cfg.model.dtype == "bfloat16"
    assert build_config(args()).cache.disk_dir is None


# ----- auth ---------------------------------------------------------------------------------
def test_authenticator():
    auth = Authenticator({"sk-a": "team-a", "sk-b": "team-b"})
    assert auth.tenant_for("Bearer sk-a") == "team-a"
    assert auth.tenant_for("bearer  sk-b ") == "team-b"
    for header in (None, "", "Bearer", "Bearer sk-c", "Basic sk-a", "sk-a"):
        with pytest.raises(APIError) as e:
            auth.tenant_for(header)
        assert e.value.status == 401 and e.value.code == "invalid_api_key"
    assert Authenticator({}).tenant_for(None) == "default"
    assert is_protected("/v1/models") and is_protected("/tokenize")
    assert not is_protected("/health") and not is_protected("/metrics")


def test_namespaces_never_cross_tenants():
    assert namespace_for("team-a", None) == "team-a"
    a1, a2 = namespace_for("team-a", "s1"), namespace_for("team-a", "s2")
    assert len({a1, a2, "team-a", namespace_for("team-b", "s1")}) == 4
    assert a1.startswith("team-a~") and "s1" not in a1  # the salt never shows (metrics)
    assert namespace_for("team-a", "s1") == a1


# ----- schemas ------------------------------------------------------------------------------
def test_chat_mapping():
    req = decode(b'{"messages": [], "max_tokens": 5, "max_completion_tokens": 7, "stop": "x",'
                 b'"top_k": -1, "temperature": 0, "seed": 3, "logprobs": true,'
                 b'"top_logprobs": 2, "some_future_field": {"a": 1}}', ChatCompletionRequest)
    p = chat_sampling_params(req)
    assert (p.max_tokens, p.stop, p.top_k, p.temperature, p.seed) == (7, ("x",), None, 0.0, 3)
    assert p.logprobs and p.top_logprobs == 2
    assert chat_sampling_params(decode(b'{"messages": []}', ChatCompletionRequest)
                                ).max_tokens is None


def test_completion_mapping_and_prompts():
    req = decode(b'{"prompt": "hi", "logprobs": 0, "n": 2}', CompletionRequest)
    p = completion_sampling_params(req)
    assert (p.max_tokens, p.logprobs, p.top_logprobs, p.n) == (16, True, 0, 2)
    assert completion_prompts("a") == ["a"]
    assert completion_prompts(["a", "b"]) == ["a", "b"]
    assert completion_prompts([1, 2]) == [[1, 2]]
    assert completion_prompts([[1], [2, 3]]) == [[1], [2, 3]]
    for bad in ([], [1, "a"], [[1], []], [True]):
        with pytest.raises(APIError):
            completion_prompts(bad)
    for body in (b'{"prompt": "a", "suffix": "z"}', b'{"prompt": "a", "best_of": 3}',
                 b'{"prompt": "a", "echo": true, "logprobs": 1}'):
        with pytest.raises(APIError) as e:
            completion_sampling_params(decode(body, CompletionRequest))
        assert e.value.code == "unsupported_parameter"


@pytest.mark.parametrize(("body", "param"), [
    (b'{"messages": [], "n": "2"}', "n"),
    (b'{"max_tokens": 3}', "messages"),
    (b'{"messages": [], "stream_options": {"include_usage": 1}}', "stream_options.include_usage"),
    (b'{"messages": [], "stop": [1]}', "stop[0]"),
    (b'{"messages": [], "max_tokens": 0}', "max_tokens"),
    (b'[]', None),
])
def test_schema_errors_name_the_field(body, param):
    with pytest.raises(msgspec.ValidationError) as e:
        decode(body, ChatCompletionRequest)
    err = to_api_error(e.value, 1)
    assert err.status == 400 and err.param == param


# ----- errors -------------------------------------------------------------------------------
def test_error_mapping():
    cases = [
        (QueueFullError("full"), 429, "queue_full", "rate_limit_error"),
        (EngineError("stopping"), 503, "shutting_down", "service_unavailable_error"),
        (NamespaceBusyError(["team-a"]), 409, "namespace_busy", "invalid_request_error"),
        (InvalidParameter("top_p", "bad"), 400, "invalid_value", "invalid_request_error"),
        (InvalidParameter("messages", "out of range"), 400,
         "invalid_value", "invalid_request_error"),
        (InvalidParameter("max_tokens", "x", code="context_length_exceeded"), 400,
         "context_length_exceeded", "invalid_request_error"),
        (PromptError("bad role", param="messages[0].role", code="unknown_role"), 400,
         "unknown_role", "invalid_request_error"),
        (msgspec.DecodeError("truncated"), 400, "invalid_json", "invalid_request_error"),
        (ZeroDivisionError(), 500, "internal_error", "server_error"),
    ]
    for exc, status, code, kind in cases:
        err = to_api_error(exc, retry_after_s=7)
        assert (err.status, err.code, err.type) == (status, code, kind), exc
        assert set(err.body()["error"]) == {"message", "type", "param", "code"}
    assert to_api_error(QueueFullError("x"), 7).headers["Retry-After"] == "7"


def test_sse_event_framing():
    assert event({"a": "x\ny"}) == b'data: {"a":"x\\ny"}\n\n'
    assert DONE == b"data: [DONE]\n\n" and KEEPALIVE == b": keep-alive\n\n"


def test_freeze_startup_heap_takes_live_objects_out_of_collections():
    kept = [[i] for i in range(1000)]  # containers alive "after start-up"
    try:
        frozen = freeze_startup_heap()
        assert frozen >= len(kept)  # (frozen objects freed later leave the count)
        collected = {id(o) for o in gc.get_objects()}  # what a collection walks
        assert all(gc.is_tracked(x) and id(x) not in collected for x in kept)
    finally:
        gc.unfreeze()
    assert gc.get_freeze_count() == 0
