"""A server configured with kernels that die of SIGILL, abort, hang and compute wrong numbers
comes up on the next candidate (the probes refuse each with its reason, in child processes),
and answers as the default server does; ``/v1/chat/completions`` through the official client."""

from __future__ import annotations

import logging

import openai
import pytest

from tests.model.fake_kernels import FAKES
from tests.server.helpers import ServerThread, real_config

pytestmark = pytest.mark.slow
QUESTION = [{"role": "user", "content": "Name three colours."}]


def answer(url: str) -> str:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="none")
    out = client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=QUESTION,
                                         max_tokens=20, temperature=0)
    return out.choices[0].message.content or ""


def test_the_server_serves_on_the_next_kernel(default_model_dir, server, caplog):
    config = real_config(default_model_dir).replace(model={
        "attention_backend": f"{FAKES},vllm-cpu,native-cpu,torch", "kernel_probe": "fresh",
        "kernel_probe_timeout_s": 8.0})
    with caplog.at_level(logging.INFO, logger="hermes_async.model"):
        srv = ServerThread(config).start()
    try:
        log = "\n".join(r.getMessage() for r in caplog.records)
        assert "fake-sigill refused: killed by SIGILL (illegal instruction)" in log
        assert "fake-abort refused: killed by SIGABRT (aborted)" in log
        assert "fake-hang refused: hung: no answer within 8 s" in log
        assert "fake-wrong refused: wrong numbers" in log
        assert answer(srv.url) == answer(server.url)
    finally:
        srv.stop()
