"""A stopped server lets go of its engine (and so of the model's weights): nothing in the
process, aiohttp's caches included, keeps a stopped app alive."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

from tests.server.helpers import ServerThread, real_config, request_json


def test_a_stopped_server_frees_its_engine(default_model_dir: Path) -> None:
    srv = ServerThread(real_config(default_model_dir)).start()
    status, _, body = request_json(f"{srv.url}/v1/completions",
                                   {"model": "SmolLM2-135M-Instruct", "prompt": "Hello",
                                    "max_tokens": 2, "temperature": 0.0})
    assert status == 200 and body["usage"]["completion_tokens"] == 2
    engine = weakref.ref(srv.engine)
    srv.stop()
    del srv
    gc.collect()
    assert engine() is None, [type(r).__name__ for r in gc.get_referrers(engine())]
