"""The serving benchmark's run configuration (:class:`BenchConfig`) and the server's URLs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class BenchConfig:
    """One benchmark run: a workload against one server, over the sweep points (the product
    of ``shares`` for prefix_share and ``concurrency`` or ``request_rate``)."""

    base_url: str = "http://127.0.0.1:8000/v1"
    model: str | None = None  # None: the first of GET /v1/models
    api_key: str | None = None
    workload: str = "shared_system"
    workload_params: dict[str, Any] = field(default_factory=dict)
    shares: list[float] | None = None  # prefix_share: one point per share
    concurrency: list[int] | None = None  # requests in flight; default [1]
    request_rate: list[float] | None = None  # requests/s, Poisson arrivals (inf: all at once)
    num_requests: int | None = 32  # per point (None: until duration_s)
    duration_s: float | None = None  # per point: no new request after it
    max_tokens: int = 64
    warmup: int = 2  # requests per point before measuring
    seed: int = 0
    temperature: float | None = 0.0
    ignore_eos: bool = False
    tokenizer: str | None = None  # a local model dir: exact prompt sizes
    timeout_s: float = 600.0
    label: str = "server"
    out: str | None = None  # JSON path
    plot_dir: str | None = None
    keep_text: bool = False  # answers in the JSON records

    def __post_init__(self) -> None:
        if self.concurrency and self.request_rate:
            raise ValueError("give concurrency or request_rate, not both")
        if not self.concurrency and not self.request_rate:
            self.concurrency = [1]
        if self.num_requests is None and self.duration_s is None:
            raise ValueError("give num_requests or duration_s")


def api_root(base_url: str) -> tuple[str, str]:
    """(the OpenAI base ending in /v1, the server root for /metrics)."""
    base = base_url.rstrip("/")
    if not base.endswith("/v1"):
        base += "/v1"
    return base, base.removesuffix("/v1")


def auth_headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}
