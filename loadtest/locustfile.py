"""Locust load test of an OpenAI-compatible server, one user class per workload of
``workloads.py``. Every request streams (SSE, ``stream_options.include_usage``); besides the
POST itself (its response time is the whole stream) each request reports custom events:
``TTFT`` (time to the first content chunk; for an empty answer, to the chunk with the finish
reason) and ``ITL`` (each gap between content chunks), so locust's table has their
percentiles. An HTTP error, an error event or a stream that ends with neither a finish chunk
nor ``data: [DONE]`` is a failure (the same rules as bench_serving: ``openai_stream.StreamTimer``).

    locust -f loadtest/locustfile.py --headless -u 4 -r 2 -t 30s --stop-timeout 60 \
        --host http://127.0.0.1:8000    # in-flight streams may finish after the 30 s
    locust -f loadtest/locustfile.py --headless -u 4 -r 2 -t 30s --host URL MultiTurnUser
    locust -f loadtest/locustfile.py --host URL    # the web UI (pick classes there)

Options (after locust's own): ``--system-tokens``, ``--max-tokens``, ``--workload-seed``,
``--temperature`` (default 0), ``--ignore-eos``, ``--tokenizer DIR``; env ``HERMES_MODEL``
(default: the first of ``GET /v1/models``) and ``HERMES_API_KEY`` (or ``OPENAI_API_KEY``).
"""

from __future__ import annotations

import os
import time
from typing import Any, ClassVar

from locust import HttpUser, events, task
from openai_stream import RequestRecord, StreamTimer
from workloads import Workload, load_tokenizer, make_workload, openai_body

MODEL_ENV = "HERMES_MODEL"
KEY_ENVS = ("HERMES_API_KEY", "OPENAI_API_KEY")


@events.init_command_line_parser.add_listener
def _add_options(parser: Any) -> None:
    group = parser.add_argument_group("hermes workloads")
    group.add_argument("--system-tokens", type=int, default=None,
                       help="system prompt size (default: each workload's own)")
    group.add_argument("--max-tokens", type=int, default=64)
    group.add_argument("--workload-seed", type=int, default=0)
    group.add_argument("--temperature", type=float, default=0.0)
    group.add_argument("--ignore-eos", action="store_true",
                       help="vLLM's extra: always --max-tokens tokens")
    group.add_argument("--tokenizer", default=None, help="local model dir: exact token sizes")


def api_key() -> str | None:
    return next((os.environ[k] for k in KEY_ENVS if os.environ.get(k)), None)


class WorkloadUser(HttpUser):
    """Sends the requests of workload ``workload_name`` (one workload per class, shared by
    its users, so a shared system prompt is shared and a multi-turn user finds its own
    conversation; gevent switches only on I/O, so no locks are needed)."""

    abstract = True
    workload_name: ClassVar[str] = ""
    workload_params: ClassVar[dict[str, Any]] = {}
    _workload: ClassVar[Workload | None] = None
    _model: ClassVar[str | None] = None

    def on_start(self) -> None:
        base = (self.host or "").rstrip("/")
        self.prefix = "" if base.endswith("/v1") else "/v1"
        key = api_key()
        self.headers = {"Authorization": f"Bearer {key}"} if key else {}
        cls = type(self)
        if WorkloadUser._model is None:
            WorkloadUser._model = os.environ.get(MODEL_ENV) or self.fetch_model()
        if cls._workload is None:
            cls._workload = self.build_workload()

    def fetch_model(self) -> str:
        """The first model of ``GET /v1/models``."""
        resp = self.client.get(f"{self.prefix}/models", headers=self.headers,
                               name="/v1/models")
        resp.raise_for_status()
        return resp.json()["data"][0]["id"]

    def build_workload(self) -> Workload:
        opts = self.environment.parsed_options
        get = (lambda name, default=None: getattr(opts, name, default)) if opts else (
            lambda name, default=None: default)
        tokenizer = load_tokenizer(get("tokenizer")) if get("tokenizer") else None
        params = {"system_tokens": get("system_tokens"), **self.workload_params}
        return make_workload(self.workload_name, strict=False, seed=get("workload_seed", 0),
                             max_tokens=get("max_tokens", 64), tokenizer=tokenizer, **params)

    @task
    def chat(self) -> None:
        workload = type(self)._workload
        assert workload is not None and WorkloadUser._model is not None
        req = workload.next_request()
        opts = self.environment.parsed_options
        body = openai_body(req, WorkloadUser._model,
                           temperature=getattr(opts, "temperature", 0.0),
                           ignore_eos=bool(getattr(opts, "ignore_eos", False)))
        answer = self.stream(body, f"chat {self.workload_name}")
        workload.record_response(req, answer)

    def stream(self, body: dict[str, Any], name: str) -> str | None:
        """Send one streamed request; fire TTFT and ITL events; return the answer text
        (None on failure). The stream is read by bench_serving's :class:`StreamTimer`, so
        both tools time and judge streams alike."""
        rec = RequestRecord(index=0, start=time.perf_counter())
        timer = StreamTimer(rec)
        with self.client.post(f"{self.prefix}/chat/completions", json=body, stream=True,
                              headers=self.headers, name=name, catch_response=True) as resp:
            if resp.status_code != 200:
                resp.failure(f"HTTP {resp.status_code}: {resp.text[:200]}")
                return None
            try:
                for line in resp.iter_lines(decode_unicode=True):
                    if line and line.startswith("data:"):  # skip blank lines and comments
                        timer.event(line[5:].strip(), time.perf_counter())
            except Exception as e:  # noqa: BLE001 - a broken stream is a failed request
                resp.failure(f"{type(e).__name__}: {e}")
                return None
            resp.request_meta["response_time"] = (time.perf_counter() - rec.start) * 1e3
            resp.request_meta["response_length"] = len(rec.text)
            error = rec.error or timer.incomplete()
            if error is not None:
                resp.failure(error)
                return None
            resp.success()
        if rec.ttft is not None:
            self.fire("TTFT", name, rec.ttft, min(rec.chunks, 1))
        for gap in rec.itls:
            self.fire("ITL", name, gap, 1)
        return rec.text

    def fire(self, kind: str, name: str, seconds: float, length: int) -> None:
        self.environment.events.request.fire(
            request_type=kind, name=name, response_time=seconds * 1e3, response_length=length,
            exception=None, context={})


class SharedSystemUser(WorkloadUser):
    weight = 3
    workload_name = "shared_system"


class DynamicFieldUser(WorkloadUser):
    weight = 3
    workload_name = "dynamic_field"


class MultiTurnUser(WorkloadUser):
    weight = 2
    workload_name = "multi_turn"


class TenantsUser(WorkloadUser):
    workload_name = "tenants"


class ToolCallsUser(WorkloadUser):
    workload_name = "tool_calls"


class NoReuseUser(WorkloadUser):
    workload_name = "no_reuse"


class PrefixShareUser(WorkloadUser):
    workload_name = "prefix_share"
    workload_params = {"share": 0.5}
