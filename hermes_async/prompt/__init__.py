"""Prompt assembly: messages -> normalized roles -> chat template -> protected token ids, cached.

Public API::

    from hermes_async.prompt import AssemblyCache, PromptAssembler
    assembler = PromptAssembler(tokenizer, cache=AssemblyCache(), model_id="smollm2")
    prompt = assembler.assemble(messages, tools=None, add_generation_prompt=True)
    prompt.token_ids, prompt.cache_outcome, prompt.num_reused_tokens

Every client-caused error is a :class:`PromptError` (a ``ValueError`` with ``param``): HTTP 400.
"""

from hermes_async.prompt.assembler import (
    AssembledPrompt,
    AssemblyOptions,
    InspectedPrompt,
    PromptAssembler,
)
from hermes_async.prompt.assembly_cache import AssemblyCache, CacheEntry, CacheOutcome, CacheStats
from hermes_async.prompt.errors import (
    MessageValidationError,
    PromptError,
    ProtectedTokenizationError,
    TemplateConfigError,
    TemplateRenderError,
    UnknownRoleError,
)
from hermes_async.prompt.messages import Conversation, Message, ToolCall
from hermes_async.prompt.parse import parse_messages
from hermes_async.prompt.roles import CANONICAL_ROLES, ROLE_TABLE, Role, RoleNormalizer
from hermes_async.prompt.tags import is_tool_tag, role_tags
from hermes_async.prompt.template import (
    ChatTemplate,
    HFChatTemplate,
    PromptTemplate,
    load_prompt_template,
)
from hermes_async.prompt.text import ADD_SPECIAL_TOKENS_DEFAULT, encode_text
from hermes_async.prompt.tokenize import ControlToken, ProtectedTokenizer, discover_control_tokens

__all__ = [
    "ADD_SPECIAL_TOKENS_DEFAULT",
    "CANONICAL_ROLES",
    "ROLE_TABLE",
    "AssembledPrompt",
    "AssemblyCache",
    "AssemblyOptions",
    "CacheEntry",
    "CacheOutcome",
    "CacheStats",
    "ChatTemplate",
    "ControlToken",
    "Conversation",
    "HFChatTemplate",
    "InspectedPrompt",
    "Message",
    "MessageValidationError",
    "PromptAssembler",
    "PromptError",
    "PromptTemplate",
    "ProtectedTokenizationError",
    "ProtectedTokenizer",
    "Role",
    "RoleNormalizer",
    "TemplateConfigError",
    "TemplateRenderError",
    "ToolCall",
    "UnknownRoleError",
    "discover_control_tokens",
    "encode_text",
    "is_tool_tag",
    "load_prompt_template",
    "parse_messages",
    "role_tags",
]
