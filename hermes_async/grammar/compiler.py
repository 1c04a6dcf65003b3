"""Compiled grammars, cached: one compile per (kind, canonical spec, tokenizer).

:meth:`GrammarCompiler.compile` is a coroutine: a miss compiles in a worker thread (llguidance
drops the GIL), so other requests keep streaming while a big schema compiles; concurrent
requests for the same new constraint wait on the same compile (single flight). Compiled
grammars live in an LRU of ``capacity`` entries; each constrained sequence gets a copy of the
pristine matcher (:meth:`CompiledGrammar.new_constraint`). Invalid constraints raise
:class:`~hermes_async.types.InvalidParameter` naming the request parameter (HTTP 400) and are
not cached.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from dataclasses import dataclass

import llguidance

from hermes_async.grammar.constraint import GrammarConstraint
from hermes_async.grammar.source import JsonOptions, grammar_source
from hermes_async.types import InvalidParameter, StructuredOutput

CacheKey = tuple[str, str, str]  # (kind, canonical spec, tokenizer id)


@dataclass(frozen=True, slots=True)
class CompiledGrammar:
    """A validated grammar at its initial state; copy it per sequence."""

    key: CacheKey
    matcher: llguidance.LLMatcher
    vocab_size: int
    compile_seconds: float

    def new_constraint(self) -> GrammarConstraint:
        return GrammarConstraint(self.matcher.deep_copy(), self.vocab_size)


@dataclass(frozen=True, slots=True)
class GrammarCacheStats:
    """Lookups of :meth:`GrammarCompiler.compile`: ``hits`` found a compiled grammar (or a
    compile in flight), ``misses`` compiled one (``failures`` of them were invalid)."""

    hits: int
    misses: int
    failures: int
    size: int
    capacity: int
    compile_seconds: float

    def as_dict(self) -> dict[str, float | int]:
        total = self.hits + self.misses
        return {"hits": self.hits, "misses": self.misses, "failures": self.failures,
                "hit_rate": self.hits / total if total else 0.0, "size": self.size,
                "capacity": self.capacity, "compile_seconds": round(self.compile_seconds, 6)}


class GrammarCompiler:
    """Compiles :class:`StructuredOutput` constraints for one tokenizer, through an LRU.

    tokenizer: llguidance's view of the model's tokenizer, with ``vocab_size`` equal to the
        width of the model's logits (see ``llguidance.hf.from_tokenizer(tok, n_vocab=...)``).
    tokenizer_id: names the tokenizer in cache keys (e.g. the model directory).
    json_options: how JSON schemas compile (number bounds).
    """

    def __init__(self, tokenizer: llguidance.LLTokenizer, tokenizer_id: str,
                 capacity: int = 256, json_options: JsonOptions | None = None) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.tokenizer = tokenizer
        self.tokenizer_id = tokenizer_id
        self.capacity = capacity
        self.json_options = json_options or JsonOptions()
        self._cache: OrderedDict[CacheKey, CompiledGrammar] = OrderedDict()
        self._inflight: dict[CacheKey, asyncio.Future[CompiledGrammar]] = {}
        self._hits = self._misses = self._failures = 0
        self._seconds = 0.0

    @property
    def vocab_size(self) -> int:
        return int(self.tokenizer.vocab_size)

    def key(self, structured: StructuredOutput) -> CacheKey:
        return (str(structured.kind), structured.spec, self.tokenizer_id)

    async def compile(self, structured: StructuredOutput,
                      param: str = "response_format") -> CompiledGrammar:
        """The compiled grammar of ``structured`` (cached); raises :class:`InvalidParameter`."""
        key = self.key(structured)
        hit = self._cache.get(key)
        if hit is not None:
            self._hits += 1
            self._cache.move_to_end(key)
            return hit
        pending = self._inflight.get(key)
        if pending is not None:
            self._hits += 1
            return await asyncio.shield(pending)
        self._misses += 1
        future: asyncio.Future[CompiledGrammar] = asyncio.get_running_loop().create_future()
        self._inflight[key] = future
        try:
            compiled = await asyncio.to_thread(self.compile_now, structured, param)
        except BaseException as e:
            if isinstance(e, InvalidParameter):
                self._failures += 1
            future.set_exception(e)
            future.exception()  # retrieved: no "never retrieved" warning without waiters
            raise
        finally:
            self._inflight.pop(key, None)
        future.set_result(compiled)
        self._cache[key] = compiled
        while len(self._cache) > self.capacity:
            self._cache.popitem(last=False)
        self._seconds += compiled.compile_seconds
        return compiled

    def compile_now(self, structured: StructuredOutput,
                    param: str = "response_format") -> CompiledGrammar:
        """Compile without the cache (blocking; the coroutine runs it in a thread)."""
        t0 = time.perf_counter()
        source = grammar_source(structured, param, self.json_options)
        matcher = llguidance.LLMatcher(self.tokenizer, source, log_level=0)
        if matcher.is_error():
            raise InvalidParameter(param, f"invalid {structured.kind} constraint: "
                                   f"{matcher.get_error()}")
        return CompiledGrammar(self.key(structured), matcher, self.vocab_size,
                               time.perf_counter() - t0)

    def stats(self) -> GrammarCacheStats:
        return GrammarCacheStats(self._hits, self._misses, self._failures, len(self._cache),
                                 self.capacity, self._seconds)
