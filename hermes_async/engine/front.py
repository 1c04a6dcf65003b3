"""``PromptFront``: what a front end needs of an engine before any forward pass.

Token ids of raw text (the project's one rule), their check against the vocabulary, chat
assembly through the assembly cache, the model's tool-call parser, structured-output grammars
and ``bad_words`` token sequences. It holds no KV cache and runs no model, so an engine
(:class:`~hermes_async.engine.async_engine.AsyncEngine` builds one from its parts) and a
process that only routes requests to engines elsewhere (the Ray Serve ingress) share it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from hermes_async.config import StructuredConfig
from hermes_async.engine.parts import GrammarCompiler, Tokenizer
from hermes_async.engine.request import CompiledConstraint
from hermes_async.prompt import AssembledPrompt, PromptAssembler, encode_text
from hermes_async.tools import ToolCallParser, parser_for
from hermes_async.types import InvalidParameter, StructuredOutput

AssemblyHook = Callable[[str | None, AssembledPrompt], None]
"""Called with ``(namespace, prompt)`` after each assembly (the engine counts outcomes)."""


@dataclass
class PromptFront:
    """Prompts and constraints of one model; see the module docstring.

    ``assembler`` None: no chat template (messages are refused). ``grammars`` None: no
    structured outputs. ``on_assembly``: see :data:`AssemblyHook`.
    """

    tokenizer: Tokenizer
    assembler: PromptAssembler | None = None
    grammars: GrammarCompiler | None = None
    structured: StructuredConfig | None = None
    on_assembly: AssemblyHook | None = None

    @property
    def vocab_size(self) -> int | None:
        """Token ids are valid in ``[0, vocab_size)``; None when the tokenizer does not say."""
        tok = self.tokenizer
        return len(tok) if hasattr(tok, "__len__") else None  # type: ignore[arg-type]

    def encode_text(self, text: str, add_special_tokens: bool | None = None) -> list[int]:
        """Token ids of raw text (``prompt.encode_text``: special tokens added unless
        ``add_special_tokens`` is False). Blocking but fast."""
        return encode_text(self.tokenizer, text, add_special_tokens)

    def check_token_ids(self, ids: Sequence[int], param: str = "prompt") -> list[int]:
        """``ids`` as a list of ints; :class:`InvalidParameter` when empty or outside the
        vocabulary."""
        out = [int(t) for t in ids]
        if not out:
            raise InvalidParameter(param, "the prompt is empty")
        vocab = self.vocab_size
        if vocab is not None and not all(0 <= t < vocab for t in out):
            raise InvalidParameter(param, f"token ids must be in [0, {vocab})")
        return out

    async def assemble(self, messages: Sequence[Any], tools: list[Any] | None = None, *,
                       add_generation_prompt: bool = True, tool_choice: Any = None,
                       namespace: str | None = None) -> AssembledPrompt:
        """Normalize roles, render the chat template and tokenize, through the assembly
        cache, off the loop. Raises ``PromptError`` (the server's 400) and
        :class:`InvalidParameter` (``no_chat_template``) without a template."""
        if self.assembler is None:
            raise InvalidParameter("messages", "this engine has no chat template; use "
                                   "/v1/completions", code="no_chat_template")
        prompt = await asyncio.to_thread(self.assembler.assemble, list(messages),
                                         tools or None, add_generation_prompt, tool_choice)
        if self.on_assembly is not None:
            self.on_assembly(namespace, prompt)
        return prompt

    async def prompt_ids(self, prompt: str | None = None, messages: list[dict] | None = None,
                         token_ids: Sequence[int] | None = None, *,
                         tools: list[Any] | None = None,
                         namespace: str | None = None) -> list[int]:
        """Token ids of exactly one of: raw text, chat messages (the model's template), ids."""
        given = [x is not None for x in (prompt, messages, token_ids)]
        if sum(given) != 1:
            raise InvalidParameter("prompt", "give exactly one of prompt, messages, token_ids")
        if token_ids is not None:
            return self.check_token_ids(token_ids)
        if messages is not None:
            ids = list((await self.assemble(messages, tools, namespace=namespace)).token_ids)
        else:
            assert prompt is not None
            ids = self.encode_text(prompt)
        if not ids:
            raise InvalidParameter("prompt", "the prompt is empty")
        return ids

    def tool_parser(self) -> ToolCallParser:
        """The parser of this model's tool calls: ``structured.tool_call_parser`` when set,
        else the format its chat template renders (``generic`` when the template shows no
        tools: the format the generic tools prompt asks for)."""
        source = self.assembler.template.tools_source if self.assembler is not None else None
        return parser_for(source, self.structured.tool_call_parser if self.structured else None)

    async def compile_grammar(self, structured: StructuredOutput,
                              param: str = "response_format") -> CompiledConstraint:
        """Compile a structured-output constraint (cached; off the loop). Raises
        :class:`InvalidParameter` naming ``param`` when it is invalid or there is no grammar
        compiler."""
        if self.grammars is None:
            raise InvalidParameter(param, "structured outputs are not available on this "
                                   "engine (no grammar compiler)",
                                   code="unsupported_parameter")
        return await self.grammars.compile(structured, param)

    def grammar_stats(self) -> dict[str, Any] | None:
        """The compiled-grammar cache's figures (None without a grammar compiler)."""
        return None if self.grammars is None else self.grammars.stats().as_dict()

    def bad_words_ids(self, words: tuple[str, ...]) -> tuple[tuple[int, ...], ...]:
        """Token sequences of ``bad_words``, as vLLM: each word alone and after a space."""
        out: set[tuple[int, ...]] = set()
        for word in words:
            for text in (word, " " + word.lstrip()):
                ids = tuple(self.tokenizer.encode(text, add_special_tokens=False))
                if ids:
                    out.add(ids)
        return tuple(sorted(out))


class FrontMethods:
    """The prompt side of the engine API, delegated to :attr:`front` (a :class:`PromptFront`):
    the same methods on a local engine and on a remote one (the Ray Serve ingress)."""

    @property
    def front(self) -> PromptFront:
        raise NotImplementedError

    @property
    def vocab_size(self) -> int | None:
        """Token ids are valid in ``[0, vocab_size)``; None when the tokenizer does not say."""
        return self.front.vocab_size

    @property
    def tokenizer(self) -> Tokenizer:
        return self.front.tokenizer

    def encode_text(self, text: str, add_special_tokens: bool | None = None) -> list[int]:
        """Token ids of raw text under the project's one rule (``prompt.encode_text``:
        special tokens added unless ``add_special_tokens`` is False). Blocking but fast; call
        it in a thread for very long texts."""
        return self.front.encode_text(text, add_special_tokens)

    def check_token_ids(self, ids: Sequence[int], param: str = "prompt") -> list[int]:
        """``ids`` as a list of ints; :class:`InvalidParameter` when empty or outside the
        vocabulary."""
        return self.front.check_token_ids(ids, param)

    async def assemble(self, messages: Sequence[Any], tools: list[Any] | None = None, *,
                       add_generation_prompt: bool = True, tool_choice: Any = None,
                       namespace: str | None = None) -> AssembledPrompt:
        """Normalize roles, render the chat template (tools included: by the template when it
        supports them, else as the generic tools prompt worded after ``tool_choice``) and
        tokenize, through the assembly cache, off the loop; the outcome is counted under
        ``namespace``.

        Raises ``PromptError`` (a ``ValueError`` with ``param``: the server's 400) and
        :class:`InvalidParameter` (``no_chat_template``) for an engine without a template.
        """
        return await self.front.assemble(messages, tools,
                                         add_generation_prompt=add_generation_prompt,
                                         tool_choice=tool_choice, namespace=namespace)

    def tool_parser(self) -> ToolCallParser:
        """The parser of this model's tool calls (:meth:`PromptFront.tool_parser`)."""
        return self.front.tool_parser()

    async def prompt_ids(self, prompt: str | None = None, messages: list[dict] | None = None,
                         token_ids: Sequence[int] | None = None, *,
                         tools: list[Any] | None = None,
                         namespace: str | None = None) -> list[int]:
        """Token ids of exactly one of: raw text, chat messages (the model's template), ids."""
        return await self.front.prompt_ids(prompt, messages, token_ids, tools=tools,
                                           namespace=namespace)

    async def compile_grammar(self, structured: StructuredOutput,
                              param: str = "response_format") -> CompiledConstraint:
        """Compile a structured-output constraint (cached; off the loop) for a request's
        ``grammar``. Raises :class:`InvalidParameter` naming ``param`` when it is invalid or
        there is no grammar compiler."""
        return await self.front.compile_grammar(structured, param)

    def grammar_stats(self) -> dict[str, Any] | None:
        """The compiled-grammar cache's figures (None without a grammar compiler)."""
        return self.front.grammar_stats()


def check_context_length(prompt_len: int, max_tokens: int | None, max_len: int) -> None:
    """:class:`InvalidParameter` ``context_length_exceeded`` unless the prompt, plus
    ``max_tokens`` when given, fits in ``max_len`` tokens."""
    if prompt_len >= max_len:
        raise InvalidParameter("messages", f"the prompt has {prompt_len} tokens; this model's "
                               f"context is {max_len} tokens", code="context_length_exceeded")
    if max_tokens is not None and prompt_len + max_tokens > max_len:
        raise InvalidParameter("max_tokens", f"prompt ({prompt_len} tokens) plus max_tokens "
                               f"({max_tokens}) exceeds the context of {max_len} tokens",
                               code="context_length_exceeded")
