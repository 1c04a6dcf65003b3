"""The prompt doctor's reader: a JSONL capture -> :class:`CapturedPrompt` objects, assembled
exactly as the server would.

One captured request per line: an OpenAI chat body (``messages``, optional ``tools`` and
``add_generation_prompt``; other keys ignored) or a raw ``prompt``: text, tokenized with
:func:`hermes_async.prompt.encode_text` (the project's one raw-text rule; a line's
``add_special_tokens`` overrides it), or a list of token ids.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hermes_async.observe.doctor_roles import RoleCheck, check_roles
from hermes_async.prompt import ChatTemplate, PromptAssembler, PromptError, encode_text

DEFAULT_NAMESPACE = "default"


class DoctorInputError(ValueError):
    """Unreadable input; ``line`` is the 1-based JSONL line at fault, when there is one."""

    def __init__(self, message: str, line: int | None = None) -> None:
        super().__init__(f"line {line}: {message}" if line is not None else message)
        self.line = line


@dataclass(frozen=True)
class CapturedPrompt:
    """One input line as the engine would see it; ``roles`` is None for a raw prompt."""

    line: int
    namespace: str
    token_ids: tuple[int, ...]
    roles: RoleCheck | None = None


class PromptReader:
    """Reads a JSONL capture into :class:`CapturedPrompt` objects with the server's assembly.

    ``template``: a chat template to use instead of the model's own.
    """

    def __init__(self, tokenizer: Any, template: ChatTemplate | None = None) -> None:
        self.tokenizer = tokenizer
        self.assembler = PromptAssembler(tokenizer, template, None)

    def read(self, path: str | Path, namespace_key: str | None = None) -> list[CapturedPrompt]:
        """Every non-blank line of ``path``; raises :class:`DoctorInputError` (with the line
        number) for a line that is not a JSON object with ``messages`` or ``prompt``, or whose
        messages the server would refuse, and for an unreadable file."""
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise DoctorInputError(f"cannot read {path}: {e}") from e
        out = []
        for no, raw in enumerate(text.splitlines(), 1):
            if raw.strip():
                out.append(self.parse_line(no, raw, namespace_key))
        return out

    def parse_line(self, no: int, raw: str, namespace_key: str | None) -> CapturedPrompt:
        """One JSONL line (``no`` is its 1-based number)."""
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as e:
            raise DoctorInputError(f"invalid JSON: {e}", no) from e
        if not isinstance(obj, dict) or ("messages" in obj) == ("prompt" in obj):
            raise DoctorInputError("expected a JSON object with 'messages' or 'prompt'", no)
        ns = DEFAULT_NAMESPACE
        if namespace_key is not None and obj.get(namespace_key) is not None:
            ns = str(obj[namespace_key])
        try:
            if "prompt" in obj:
                return CapturedPrompt(no, ns, self._raw_prompt(obj["prompt"], obj))
            inspected = self.assembler.inspect(
                obj["messages"], tools=obj.get("tools"),
                add_generation_prompt=bool(obj.get("add_generation_prompt", True)))
        except PromptError as e:
            raise DoctorInputError(f"{e} (param: {e.param})", no) from e
        return CapturedPrompt(no, ns, inspected.prompt.token_ids, check_roles(inspected))

    def _raw_prompt(self, prompt: Any, obj: dict[str, Any]) -> tuple[int, ...]:
        if isinstance(prompt, str):
            special = obj.get("add_special_tokens")
            ids = tuple(encode_text(self.tokenizer, prompt,
                                    None if special is None else bool(special)))
        elif isinstance(prompt, list) and all(type(t) is int for t in prompt):
            ids = tuple(prompt)
        else:
            raise PromptError("prompt must be a string or a list of token ids", param="prompt")
        if not ids:
            raise PromptError("the prompt is empty", param="prompt")
        return ids

    def unknown_roles(self) -> dict[str, int]:
        """Unknown raw roles mapped to ``user`` while reading (a tool-role mix-up suspect)."""
        return self.assembler.roles.unknown_role_counts()
