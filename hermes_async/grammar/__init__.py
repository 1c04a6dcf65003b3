"""Structured outputs: constraints compiled into token masks by llguidance.

``hermes_async.grammar`` turns a :class:`~hermes_async.types.StructuredOutput` (JSON schema,
regex, choice, Lark/GBNF grammar) into an llguidance grammar (:mod:`.source`), compiles it once
per tokenizer in a worker thread behind an LRU with single-flight (:mod:`.compiler`), and hands
each constrained sequence its own matcher (:mod:`.constraint`): the sampler asks it for the
allowed-token bitmask of the next step, the engine feeds it each accepted token.

Why llguidance (not xgrammar): one 3 MB wheel with no dependencies (xgrammar pulls triton and
tvm-ffi here), masks computed in Rust without the GIL in tens of microseconds, JSON schema,
regex and Lark grammars (GBNF converted), and it is one of vLLM's and SGLang's backends.
"""

from hermes_async.grammar.compiler import CompiledGrammar, GrammarCacheStats, GrammarCompiler
from hermes_async.grammar.constraint import GrammarConstraint
from hermes_async.grammar.source import JsonOptions, grammar_source

__all__ = ["CompiledGrammar", "GrammarCacheStats", "GrammarCompiler", "GrammarConstraint",
           "JsonOptions", "grammar_source"]
