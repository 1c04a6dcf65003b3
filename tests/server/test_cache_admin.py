"""The cache admin API end to end on the default model: ``/cache/stats`` figures, the
dynamic-field detector on loadtest's workloads, warm-up with pins, reset, and who may see what.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from hermes_async.openai import CacheScope, Caller, JSONResponse, RequestContext, cache_reset
from tests.server.helpers import ServerThread, engine_idle, real_config, request_json

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "loadtest"))
from workloads import make_workload  # noqa: E402

ADMIN, KEY_A, KEY_B = "admin-key", "key-a", "key-b"


def chat(srv: ServerThread, messages: list[dict[str, Any]], key: str | None = None,
         **extra: Any) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    status, _, body = request_json(f"{srv.base_url}/chat/completions",
                                   {"messages": messages, "max_tokens": 2, **extra},
                                   headers=headers)
    assert status == 200, body
    return body


def stats(srv: ServerThread, key: str | None = None, query: str = "") -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    status, _, body = request_json(f"{srv.url}/cache/stats{query}", headers=headers)
    return status, body


@pytest.fixture(scope="module")
def srv(default_model_dir: Path):
    s = ServerThread(real_config(default_model_dir)).start()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def keyed(default_model_dir: Path):
    cfg = real_config(default_model_dir, server={"api_keys": {KEY_A: "team-a", KEY_B: "team-b"},
                                                 "admin_key": ADMIN})
    s = ServerThread(cfg).start()
    yield s
    s.stop()


def test_dynamic_field_workload_is_reported_and_the_fixed_one_is_not(srv):
    fixed = make_workload("shared_system", system_tokens=400, seed=1)
    dynamic = make_workload("dynamic_field", system_tokens=400, seed=1)
    for _ in range(6):
        chat(srv, fixed.next_request()["messages"], cache_salt="fixed")
        chat(srv, dynamic.next_request()["messages"], cache_salt="dynamic")
    status, doc = stats(srv)
    assert status == 200
    (fixed_ns,) = [ns for ns, d in doc["namespaces"].items() if d["prefix"]["hit_rate"]
                   and d["prefix"]["hit_rate"] > 0.5]
    assert doc["namespaces"][fixed_ns]["divergences"] == []
    dyn = [d for d in doc["namespaces"].values() if d["divergences"]]
    assert len(dyn) == 1
    (point, *_) = dyn[0]["divergences"]
    assert point["requests"] == 5 and point["tokens_lost"] >= 5 * 320
    # the timestamp sits right after the template's "<|im_start|>system\nCurrent time: "
    assert "Current time:" in point["text_before"] and point["block"] == 0
    digits = set("0123456789")
    assert set(point["text_this"]) & digits and set(point["text_other"]) & digits
    assert point["text_this"] != point["text_other"]
    assert dyn[0]["prefix"]["hit_rate"] < 0.1


def test_stats_document_has_the_three_figures_and_the_pool(srv):
    msgs = [{"role": "system", "content": "You answer briefly. " * 40},
            {"role": "user", "content": "Hi"}]
    for _ in range(3):
        chat(srv, msgs)
    status, doc = stats(srv, query="?namespace=default")
    assert status == 200 and set(doc["namespaces"]) == {"default"}
    ns = doc["namespaces"]["default"]
    assert ns["prefix"]["hit_rate_1m"] > 0.5 and ns["prefix"]["mean_matched_len"] > 0
    assert ns["assembly"]["hit_rate"] > 0.5  # the same messages list again: a whole hit
    assert ns["nodes"] >= 1 and ns["tree_depth"] >= 1
    b = doc["blocks"]
    assert b["free"] + b["cached"] + b["referenced"] + b["private"] == b["total"]
    assert 0 <= b["pinned"] <= b["referenced"]  # operator pins: a part of the referenced
    assert doc["engine"] == {"running": 0, "waiting": 0} and doc["block_size"] == 32


def test_warm_pins_then_reset_drops_the_pin(srv):
    system = [{"role": "system", "content": "Pinned operating manual. " * 60}]
    status, _, res = request_json(f"{srv.url}/cache/warm",
                                  {"messages": system, "namespace": "manual", "pin_ttl_s": 600})
    assert status == 200, res
    assert res["pinned"] and res["cached_tokens"] >= res["prompt_tokens"] - 32
    assert res["pin"]["blocks"] * 32 == res["pin"]["tokens"] > 0
    _, doc = stats(srv, query="?namespace=manual")
    assert doc["namespaces"]["manual"]["pins"][0]["expires_in_s"] > 590
    assert doc["namespaces"]["manual"]["blocks"]["pinned"] == res["pin"]["blocks"]
    status, _, res2 = request_json(f"{srv.url}/cache/reset", {"namespace": "manual"})
    assert status == 200 and res2["unpinned"] == 1 and res2["freed_blocks"] >= 1
    assert srv.call(lambda: engine_idle(srv.engine))["pinned"] == 0
    srv.call(srv.engine.check_integrity)


def test_warm_and_reset_errors(srv):
    status, _, body = request_json(f"{srv.url}/cache/warm", {"prompt": "x", "messages": []})
    assert status == 400 and body["error"]["code"] == "invalid_value"
    status, _, body = request_json(f"{srv.url}/cache/warm", {"prompt": "x", "pin_ttl_s": 0})
    assert status == 400 and body["error"]["param"] == "pin_ttl_s"
    status, _, body = request_json(f"{srv.url}/cache/stats?top=x")
    assert status == 400


def test_reset_is_refused_while_a_request_runs_in_the_namespace(srv):
    async def hold_and_reset() -> tuple[int, str]:
        engine = srv.engine
        req = engine.add_request(engine.encode_text("Count slowly: one two three"),
                                 None, namespace="busy")
        ctx = RequestContext(srv.state, Caller(scope=CacheScope(None)))  # the admin
        try:  # the service behind POST /cache/reset, over the engine's one busy rule
            res = await cache_reset(ctx, b'{"namespace": "busy"}')
        finally:
            engine.abort(req.request_id)
        assert isinstance(res, JSONResponse)
        return res.status, res.body["error"]["code"]

    assert srv.run(hold_and_reset()) == (409, "namespace_busy")


def test_scopes_admin_sees_all_tenants_only_their_own(keyed):
    chat(keyed, [{"role": "user", "content": "hello from a"}], KEY_A)
    chat(keyed, [{"role": "user", "content": "hello from b"}], KEY_B)
    assert stats(keyed)[0] == 401
    assert stats(keyed, "wrong")[0] == 401
    _, doc = stats(keyed, ADMIN)
    assert {"team-a", "team-b"} <= set(doc["namespaces"])
    _, doc = stats(keyed, KEY_A)
    assert set(doc["namespaces"]) == {"team-a"}
    status, body = stats(keyed, KEY_A, "?namespace=team-b")
    assert status == 403 and body["error"]["code"] == "namespace_forbidden"
    headers = {"Authorization": f"Bearer {KEY_A}"}
    status, _, body = request_json(f"{keyed.url}/cache/reset", {"namespace": "*"},
                                   headers=headers)
    assert status == 403
    status, _, body = request_json(f"{keyed.url}/cache/warm", {"prompt": "team a's manual"},
                                   headers=headers)
    assert status == 200 and body["namespace"] == "team-a"
    status, _, body = request_json(f"{keyed.url}/cache/reset", {"namespace": "*"},
                                   headers={"Authorization": f"Bearer {ADMIN}"})
    assert status == 200
