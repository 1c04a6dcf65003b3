"""Chat templates: the model's own Jinja template, or a :class:`PromptTemplate` from a TOML file.

A template turns template-ready message dicts (see ``Message.to_template_dict``) into prompt
text. Every template has a ``version`` that is part of every assembly-cache key: a
digest of its source and its special-token settings, or an explicit value for a configured one.
"""

from __future__ import annotations

import hashlib
import json
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import jinja2

from hermes_async.config import read_toml
from hermes_async.prompt.errors import TemplateConfigError, TemplateRenderError
from hermes_async.prompt.roles import CANONICAL_ROLES
from hermes_async.tools import template_supports_tools


def _digest(obj: Any) -> str:
    blob = json.dumps(obj, sort_keys=True, ensure_ascii=False, default=str).encode()
    return hashlib.blake2b(blob, digest_size=8).hexdigest()


class ChatTemplate(ABC):
    """Contract of a chat template.

    ``render`` must be a pure function of its arguments (the assembly cache relies on it) and
    must raise :class:`TemplateRenderError` for conversations it refuses.
    ``literal_text`` is every string the template itself can emit (used to find which added
    tokens are control tokens).
    """

    name: str
    version: str

    @abstractmethod
    def render(self, messages: Sequence[Mapping[str, Any]], *, tools: Sequence[Any] | None,
               add_generation_prompt: bool) -> str:
        """Prompt text for ``messages`` (template-ready dicts)."""

    @property
    @abstractmethod
    def literal_text(self) -> str:
        """The template's own text (source, tags), searched for control-token strings."""

    @property
    def tools_source(self) -> str | None:
        """The template text that renders tools (where the tool-call format is read from), or
        None when the template cannot show tools to the model (the assembler then adds them
        itself, see :func:`hermes_async.tools.generic_tools_prompt`)."""
        return None


class HFChatTemplate(ChatTemplate):
    """The model's own Jinja chat template, rendered by ``transformers`` (tools and
    ``add_generation_prompt`` passed through; the tokenizer's special tokens are in scope).

    ``chat_template`` overrides the tokenizer's template source; ``version`` overrides the digest
    of sources + special-token settings.
    """

    def __init__(self, tokenizer: Any, *, chat_template: str | None = None,
                 version: str | None = None, name: str = "model") -> None:
        self._tokenizer = tokenizer
        try:
            self._plain_source = tokenizer.get_chat_template(chat_template, None)
            self._tools_source = tokenizer.get_chat_template(chat_template, [])
        except ValueError as e:
            raise TemplateConfigError(
                f"the tokenizer has no chat template ({e}); configure a PromptTemplate") from e
        self.name = name
        specials = {
            "special_tokens_map": tokenizer.special_tokens_map,
            "added": [(int(i), str(t.content), bool(t.special), bool(t.lstrip), bool(t.rstrip),
                       bool(t.normalized), bool(t.single_word))
                      for i, t in sorted(tokenizer.added_tokens_decoder.items())],
            "chat_control_tokens": getattr(tokenizer, "chat_control_tokens", None),
        }
        self.source_digest = _digest({"plain": self._plain_source, "tools": self._tools_source,
                                      "specials": specials})
        self.version = version or f"hf-{self.source_digest}"

    @property
    def source(self) -> str:
        """The Jinja source used without tools."""
        return self._plain_source

    @property
    def literal_text(self) -> str:
        return self._plain_source + "\0" + self._tools_source

    @property
    def tools_source(self) -> str | None:
        return self._tools_source if template_supports_tools(self._tools_source) else None

    def render(self, messages: Sequence[Mapping[str, Any]], *, tools: Sequence[Any] | None,
               add_generation_prompt: bool) -> str:
        source = self._tools_source if tools else self._plain_source
        try:
            return self._tokenizer.apply_chat_template(
                list(messages), tools=list(tools) if tools else None, chat_template=source,
                add_generation_prompt=add_generation_prompt, tokenize=False)
        except jinja2.TemplateError as e:
            raise TemplateRenderError(f"chat template refused the conversation: {e}",
                                      param="messages") from e
        except (TypeError, KeyError, AttributeError) as e:
            raise TemplateRenderError(f"chat template failed on this conversation: {e!r}",
                                      param="messages") from e


_DEFAULT_TOOL_CALL = "{json}"


@dataclass(frozen=True)
class PromptTemplate(ChatTemplate):
    """The TOML template form, for models without a template or for overrides.

    Rendering: ``bos``; then per message its role tag, an optional ``name_format`` line
    (``{name}`` replaced), the content (stripped when ``strip_content``), its tool calls (each
    ``tool_call_format`` with ``{json}`` replaced by ``{"name", "arguments"}`` as JSON, one per
    line), and ``eos + message_suffix`` after **every** message; finally ``generation_prompt``
    (default: the assistant tag) when asked. Tool definitions are rendered only when
    ``tools_header`` is set, as a first system block (header, then one JSON object per line);
    otherwise passing tools is an error. All four role tags are required, so tool results can
    never fall back to the user tag.
    """

    name: str
    role_tags: Mapping[str, str]
    bos: str = ""
    eos: str = ""
    message_suffix: str = "\n"
    name_format: str = "name={name}\n"
    strip_content: bool = True
    generation_prompt: str | None = None
    tool_call_format: str = _DEFAULT_TOOL_CALL
    tools_header: str | None = None
    explicit_version: str | None = field(default=None, repr=False)
    _version: str = field(default="", init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        missing = [r for r in CANONICAL_ROLES if not isinstance(self.role_tags.get(r), str)]
        if missing:
            raise TemplateConfigError(f"template {self.name!r}: role_tags needs string tags for "
                                      f"{', '.join(missing)}")
        extra = sorted(set(self.role_tags) - set(CANONICAL_ROLES))
        if extra:
            raise TemplateConfigError(f"template {self.name!r}: unknown roles in role_tags: "
                                      f"{', '.join(extra)}")
        object.__setattr__(self, "role_tags", dict(self.role_tags))
        fields = asdict(self)
        del fields["explicit_version"], fields["_version"]
        object.__setattr__(self, "_version", self.explicit_version or f"seed-{_digest(fields)}")

    @property
    def version(self) -> str:  # type: ignore[override]
        """The explicit ``version`` from the config, else a digest of every rendering field."""
        return self._version

    @property
    def tools_source(self) -> str | None:
        return self.tools_header  # its tool calls: one {"name", "arguments"} JSON per line

    @property
    def literal_text(self) -> str:
        parts = [self.bos, self.eos, self.message_suffix, self.name_format, self.tool_call_format,
                 self.generation_prompt or "", self.tools_header or "", *self.role_tags.values()]
        return "\0".join(parts)

    def render(self, messages: Sequence[Mapping[str, Any]], *, tools: Sequence[Any] | None,
               add_generation_prompt: bool) -> str:
        end = self.eos + self.message_suffix
        parts = [self.bos]
        if tools:
            if self.tools_header is None:
                raise TemplateRenderError(f"template {self.name!r} does not support tools",
                                          param="tools")
            lines = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
            parts += [self.role_tags["system"], self.tools_header, lines, end]
        for msg in messages:
            parts.append(self.role_tags[msg["role"]])
            if msg.get("name"):
                parts.append(self.name_format.replace("{name}", msg["name"]))
            content = msg["content"]
            parts.append(content.strip() if self.strip_content else content)
            calls = msg.get("tool_calls") or ()
            if calls and content:
                parts.append("\n")
            for i, call in enumerate(calls):
                fn = call["function"]
                blob = json.dumps({"name": fn["name"], "arguments": fn["arguments"]},
                                  ensure_ascii=False)
                parts.append(("\n" if i else "") + self.tool_call_format.replace("{json}", blob))
            parts.append(end)
        if add_generation_prompt:
            gen = self.generation_prompt
            parts.append(self.role_tags["assistant"] if gen is None else gen)
        return "".join(parts)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PromptTemplate:
        """Build from a ``[template]`` table; unknown keys are an error."""
        known = {"name", "version", "role_tags", "bos", "eos", "message_suffix", "name_format",
                 "strip_content", "generation_prompt", "tool_call_format", "tools_header"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise TemplateConfigError(f"unknown key(s) in [template]: {', '.join(unknown)}")
        values = dict(data)
        if not isinstance(values.get("name"), str) or not isinstance(values.get("role_tags"),
                                                                     Mapping):
            raise TemplateConfigError("[template] needs a string 'name' and a [template.role_tags]")
        version = values.pop("version", None)
        if version is not None and (not isinstance(version, str) or not version):
            raise TemplateConfigError("[template] version must be a non-empty string")
        return cls(**values, explicit_version=version)


def load_prompt_template(path: str | Path) -> PromptTemplate:
    """Read a seed-form :class:`PromptTemplate` from a TOML file with a ``[template]`` table
    (see ``configs/templates/chatml.toml``)."""
    p = Path(path)
    data = read_toml(p, TemplateConfigError, "template")
    if set(data) != {"template"} or not isinstance(data["template"], Mapping):
        raise TemplateConfigError(f"{p}: expected exactly one [template] table")
    return PromptTemplate.from_dict(data["template"])
