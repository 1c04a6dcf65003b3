"""PromptAssembler: messages -> validated, normalized, templated, protected token ids, cached.

Flow per call: validate + normalize roles -> cache key -> exact hit? -> render the
template over marked user strings -> longest cached message prefix whose rendering is a prefix
of this one? (tokenize only the tail) -> else full protected tokenization -> store.

Cache keys are ``(model_id, template.version, role sequence, blake2b content digest,
add_generation_prompt, tools digest, tokenization options)``. Incremental reuse takes the ids of
a cached message prefix up to one of its last template control tokens (the latest one such that
the new rendering starts with the cached rendering up to the end of that token); the tail starts
at a control token, a hard tokenization boundary, so the result equals a full assembly.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from hermes_async.prompt.assembly_cache import AssemblyCache, CacheEntry, CacheOutcome
from hermes_async.prompt.errors import PromptError
from hermes_async.prompt.messages import Conversation, Message
from hermes_async.prompt.parse import parse_messages
from hermes_async.prompt.roles import RoleNormalizer
from hermes_async.prompt.template import ChatTemplate, HFChatTemplate
from hermes_async.prompt.tokenize import MAX_CUTS, ProtectedTokenizer, discover_control_tokens
from hermes_async.prompt.tools_prompt import with_generic_tools


@dataclass(frozen=True)
class AssemblyOptions:
    """How prompts are assembled.

    strict_roles: an unknown role is a 400 error instead of being mapped to ``user``.
    allow_special_tokens_in_content: plain behaviour; a control-token string typed by a user
        becomes that control token (off by default: it is encoded as text).
    incremental: reuse the ids of the longest cached message prefix (needs a cache).
    """

    strict_roles: bool = False
    allow_special_tokens_in_content: bool = False
    incremental: bool = True


@dataclass(frozen=True, slots=True)
class AssembledPrompt:
    """The engine's input for one request.

    token_ids: the prompt; text: the rendered prompt; cache_outcome: ``hit`` (exact),
    ``partial`` (``num_reused_tokens`` ids taken from a cached prefix) or ``miss``;
    role_counts: messages per canonical role.
    """

    token_ids: tuple[int, ...]
    text: str
    cache_outcome: CacheOutcome
    num_reused_tokens: int
    template_version: str
    role_counts: Mapping[str, int]

    @property
    def num_tokens(self) -> int:
        """Prompt length in tokens."""
        return len(self.token_ids)


@dataclass(frozen=True, slots=True)
class InspectedPrompt:
    """:meth:`PromptAssembler.inspect`: the prompt plus its pieces, control tokens flagged."""

    prompt: AssembledPrompt
    segments: list[tuple[str, bool]]
    messages: tuple[Message, ...]


_NO_TOOLS = b""


class PromptAssembler:
    """Assembles prompts for one tokenizer + template; share one :class:`AssemblyCache` freely.

    ``template`` defaults to the tokenizer's own chat template; ``cache=None`` disables caching
    (every call is a ``miss``). Unknown-role counters: :attr:`roles`. Thread-safe.
    """

    def __init__(self, tokenizer: Any, template: ChatTemplate | None = None,
                 cache: AssemblyCache | None = None, options: AssemblyOptions | None = None,
                 *, model_id: str = "default") -> None:
        self.options = options or AssemblyOptions()
        self.template = template if template is not None else HFChatTemplate(tokenizer)
        self.cache = cache
        self.model_id = model_id
        self.roles = RoleNormalizer(strict=self.options.strict_roles)
        controls = discover_control_tokens(tokenizer, self.template.literal_text)
        self.tokenizer = ProtectedTokenizer(
            tokenizer, controls,
            allow_special_tokens_in_content=self.options.allow_special_tokens_in_content)
        self._control_len = {c.id: len(c.content) for c in controls}
        self._opts_key = (self.options.allow_special_tokens_in_content, self.tokenizer.fingerprint)

    @property
    def template_version(self) -> str:
        """Version of the template in use (part of every cache key)."""
        return self.template.version

    def _tools_digest(self, tools: Any) -> bytes:
        if tools is None or (isinstance(tools, list) and not tools):
            return _NO_TOOLS
        if not isinstance(tools, list) or not all(isinstance(t, Mapping) for t in tools):
            raise PromptError("tools must be a list of objects", param="tools")
        try:
            blob = msgspec.json.encode(tools, order="sorted")
        except (TypeError, msgspec.EncodeError) as e:
            raise PromptError(f"tools must be JSON data: {e}", param="tools") from e
        return hashlib.blake2b(blob, digest_size=16).digest()

    def _key(self, conv: Conversation, n: int, gen: bool, tools_digest: bytes) -> tuple[Any, ...]:
        return (self.model_id, self.template.version, conv.role_codes[:n],
                conv.prefix_digest(n), gen, tools_digest, self._opts_key)

    def render_marked(self, conv: Conversation, tools: list[Any] | None,
                      gen: bool) -> tuple[str, bool]:
        """Render ``conv`` with every user-supplied string marked (see ``marking``); also
        returns whether any string needed a mark."""
        mark, mark_tree = self.tokenizer.mark, self.tokenizer.mark_tree
        dicts = []
        marked_any = False
        for msg in conv.messages:
            d = msg.to_template_dict()
            content = d["content"]
            d["content"] = mark(content)
            marked_any = marked_any or d["content"] is not content
            for key in ("name", "tool_call_id"):
                if key in d:
                    value = d[key]
                    d[key] = mark(value)
                    marked_any = marked_any or d[key] is not value
            if "tool_calls" in d:
                d["tool_calls"] = mark_tree(d["tool_calls"])
                marked_any = True  # nested: not tracked; only enables the escape check
            dicts.append(d)
        marked_tools = None
        if tools:
            marked_tools = mark_tree(tools)
            marked_any = True
        text = self.template.render(dicts, tools=marked_tools, add_generation_prompt=gen)
        return text, marked_any

    @property
    def supports_tools(self) -> bool:
        """The template shows tools itself; else :meth:`assemble` adds the generic tools
        prompt (:mod:`hermes_async.prompt.tools_prompt`)."""
        return self.template.tools_source is not None

    def _with_tools(self, messages: Sequence[Any], tools: list[Any] | None,
                    tool_choice: Any) -> tuple[Sequence[Any], list[Any] | None]:
        if not tools or self.supports_tools:
            return messages, tools
        self._tools_digest(tools)  # validates
        return with_generic_tools(messages, tools, tool_choice), None

    def assemble(self, messages: Sequence[Any], tools: list[Any] | None = None,
                 add_generation_prompt: bool = True,
                 tool_choice: Any = None) -> AssembledPrompt:
        """Token ids for OpenAI-style ``messages`` (and ``tools``) under this template.

        ``tools`` go to a template that supports them; otherwise they are described in a
        system message by the generic tools prompt (worded after ``tool_choice``).
        Raises :class:`~hermes_async.prompt.errors.PromptError` subclasses (HTTP 400) for
        malformed messages, unknown roles under ``strict_roles``, bad tools, or a conversation
        the template refuses.
        """
        messages, tools = self._with_tools(messages, tools, tool_choice)
        conv = parse_messages(messages, self.roles)
        return self._assemble(conv, tools, add_generation_prompt)[0]

    def inspect(self, messages: Sequence[Any], tools: list[Any] | None = None,
                add_generation_prompt: bool = True, tool_choice: Any = None) -> InspectedPrompt:
        """Like :meth:`assemble` (bypassing the cache) plus the text pieces with control
        tokens flagged, for ``hermes-async render`` and debugging."""
        messages, tools = self._with_tools(messages, tools, tool_choice)
        conv = parse_messages(messages, self.roles)
        self._tools_digest(tools)  # validates
        marked, marked_any = self.render_marked(conv, tools, add_generation_prompt)
        enc = self.tokenizer.encode(marked, marked_inputs=marked_any)
        prompt = AssembledPrompt(tuple(enc.ids), enc.text, "miss", 0, self.template.version,
                                 conv.role_counts())
        return InspectedPrompt(prompt, self.tokenizer.segments(marked), conv.messages)

    def _assemble(self, conv: Conversation, tools: list[Any] | None,
                  gen: bool) -> tuple[AssembledPrompt, CacheEntry]:
        tools_digest = self._tools_digest(tools)
        n = len(conv)
        cache = self.cache
        key = self._key(conv, n, gen, tools_digest)
        version = self.template.version
        if cache is not None:
            entry = cache.get(key)
            if entry is not None:
                cache.record("hit")
                return AssembledPrompt(entry.token_ids, entry.text, "hit", len(entry.token_ids),
                                       version, conv.role_counts()), entry
        marked, marked_any = self.render_marked(conv, tools, gen)
        extended = None
        if cache is not None and self.options.incremental:
            extended = self._extend(conv, marked, marked_any, n, gen, tools_digest)
        outcome: CacheOutcome
        if extended is not None:
            (entry, reused), outcome = extended, "partial"
        else:
            enc = self.tokenizer.encode(marked, marked_inputs=marked_any)
            entry = CacheEntry(tuple(enc.ids), marked, enc.text, enc.cuts)
            reused, outcome = 0, "miss"
        if cache is not None:
            cache.record(outcome)
            cache.put(key, entry)
        return AssembledPrompt(entry.token_ids, entry.text, outcome, reused, version,
                               conv.role_counts()), entry

    def _extend(self, conv: Conversation, marked: str, marked_any: bool, n: int, gen: bool,
                tools_digest: bytes) -> tuple[CacheEntry, int] | None:
        """Reuse the longest cached message prefix whose rendering this one extends."""
        assert self.cache is not None
        for j in range(n, 0, -1):
            for g in (gen, not gen):
                if j == n and g == gen:
                    continue
                prev = self.cache.get(self._key(conv, j, g, tools_digest))
                if prev is None:
                    continue
                for cut_char, cut_tok in prev.cuts:
                    if cut_tok == 0:
                        break
                    ctrl_id = prev.token_ids[cut_tok]
                    cut_end = cut_char + self._control_len[ctrl_id]
                    if not marked.startswith(prev.marked_text[:cut_end]):
                        continue  # the template rendered this part differently: cut earlier
                    enc = self.tokenizer.encode(marked[cut_char:], at_text_start=False,
                                                marked_inputs=marked_any)
                    if not enc.ids or enc.ids[0] != ctrl_id:
                        break
                    ids = prev.token_ids[:cut_tok] + tuple(enc.ids)
                    cuts = tuple((cut_char + c, cut_tok + t) for c, t in enc.cuts)
                    cuts += tuple(c for c in prev.cuts if c[0] < cut_char)[:MAX_CUTS - len(cuts)]
                    text = self.tokenizer.restore(marked)
                    return CacheEntry(ids, marked, text, cuts), cut_tok
        return None
