"""The README's structured-output and tool-calling examples run as written against the real
default model (only the server's address is changed)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow

README = Path(__file__).resolve().parents[2] / "README.md"


def examples() -> list[str]:
    text = README.read_text(encoding="utf-8")
    section = text[text.index("### Structured outputs and tool calls"):text.index("## Layout")]
    return re.findall(r"```python\n(.*?)```", section, re.S)


def test_readme_has_the_examples() -> None:
    blocks = examples()
    assert len(blocks) == 2
    assert "chat.completions.parse" in blocks[0] and "tool_calls" in blocks[1]


@pytest.mark.parametrize("index", [0, 1])
def test_readme_example_runs(server: Any, index: int) -> None:
    code = examples()[index].replace("http://127.0.0.1:8000/v1", server.base_url)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
