"""Which parser reads a model's tool calls: the configured one (``tool_call_parser``), else the
one its chat template's text points to."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from types import MappingProxyType

from hermes_async.tools.generic import GenericParser
from hermes_async.tools.hermes import HermesParser
from hermes_async.tools.llama3 import Llama3JsonParser
from hermes_async.tools.mistral import MistralParser
from hermes_async.tools.streaming import ToolCallParser

PARSERS: Mapping[str, Callable[[], ToolCallParser]] = MappingProxyType({
    "generic": GenericParser,
    "hermes": HermesParser,
    "llama3_json": Llama3JsonParser,
    "mistral": MistralParser,
})
"""Parser names -> factories (read-only)."""

_JINJA = re.compile(r"\{\{.*?\}\}|\{%.*?%\}", re.DOTALL)
_STRING = re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"", re.DOTALL)
_TOOLS = re.compile(r"\btools\b")


def template_supports_tools(chat_template: str | None) -> bool:
    """The template's Jinja code (outside its string literals) refers to ``tools``."""
    if not chat_template:
        return False
    return any(_TOOLS.search(_STRING.sub("''", m.group())) for m in
               _JINJA.finditer(chat_template))


def parser_for(chat_template: str | None, override: str | None = None) -> ToolCallParser:
    """The parser for a model: ``override`` (config ``tool_call_parser``) when given (an
    unknown name raises ValueError naming the choices); else ``generic`` when the template has
    no tool support (the engine then adds the generic tools prompt); else from the template's
    text: ``<tool_call>`` -> hermes, ``[TOOL_CALLS]`` -> mistral, ``<|python_tag|>`` or Llama
    3.x's ``ipython`` role with ``"parameters"`` -> llama3_json, anything else -> hermes.
    """
    if override:
        factory = PARSERS.get(override)
        if factory is None:
            raise ValueError(f"unknown tool_call_parser {override!r}; choices: "
                             + ", ".join(sorted(PARSERS)))
        return factory()
    if not template_supports_tools(chat_template):
        return GenericParser()
    assert chat_template is not None
    if "<tool_call>" in chat_template:
        return HermesParser()
    if "[TOOL_CALLS]" in chat_template:
        return MistralParser()
    if "<|python_tag|>" in chat_template or (
            "ipython" in chat_template and "parameters" in chat_template):
        return Llama3JsonParser()
    return HermesParser()
