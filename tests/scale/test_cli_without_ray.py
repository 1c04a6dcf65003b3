"""``hermes-async serve --replicas N`` without the ray extra says how to install it."""

from __future__ import annotations

import subprocess
import sys

PROGRAM = """
import sys
sys.modules["ray"] = None  # as if the ray extra were not installed
from hermes_async.cli import main
sys.exit(main(["serve", "--replicas", "2"]))
"""


def test_replicas_without_ray_say_how_to_install_it() -> None:
    done = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2, done.stderr
    assert "pip install 'hermes_async[ray]'" in done.stderr


def test_the_core_never_imports_ray() -> None:
    program = ("import sys; import hermes_async, hermes_async.server.app, hermes_async.asgi, "
               "hermes_async.cli.serve; assert 'ray' not in sys.modules, 'ray imported'")
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
