"""From a :class:`StructuredOutput` to the text of an llguidance grammar.

- ``json``: the JSON schema (``{"type":"object"}``, OpenAI's ``json_object``, is the bounded
  grammar of :mod:`.json_object`), its
  unbounded numbers bounded (:mod:`.json_bounds`), compiled by llguidance's JSON-schema
  compiler (properties in schema order, bounded whitespace);
- ``regex``: the whole output matches the regex (Rust ``regex`` syntax);
- ``choice``: exactly one of the listed strings (the spec is their JSON list);
- ``grammar``: a Lark grammar in llguidance's dialect; other text is read as GBNF
  (llama.cpp's and vLLM's EBNF) and converted to Lark first (text with a ``start:`` rule or
  ``%llguidance`` is Lark already).

:func:`grammar_source` never validates; :meth:`GrammarCompiler.compile` does, against the
tokenizer, and reports the error naming the parameter.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import llguidance
from llguidance.gbnf_to_lark import any_to_lark

from hermes_async.grammar.json_bounds import bound_numbers
from hermes_async.grammar.json_object import json_object_lark
from hermes_async.types import GuideKind, InvalidParameter, StructuredOutput


@dataclass(frozen=True)
class JsonOptions:
    """How JSON schemas compile: unbounded numbers get at most ``fraction_digits`` decimals
    and ``integer_digits`` integer digits (see :mod:`.json_bounds`; None: unbounded), and
    whitespace between tokens matches ``whitespace_pattern``."""

    fraction_digits: int | None = 6
    integer_digits: int | None = 15
    free_depth: int | None = 3
    """Free-form objects (``json_object``) nest at most this deep."""
    whitespace_pattern: str | None = r"\n?[ \t]{0,24}"
    """Whitespace allowed between JSON tokens: one optional newline and some indentation
    (pretty-printed JSON passes; endless blank lines, a small model's favourite, do not).
    None: llguidance's default (any run of whitespace)."""

JSON_OBJECT_SPEC = '{"type":"object"}'
"""The canonical spec of "any JSON object" (OpenAI's ``json_object``)."""

_REGEX_META = set("\\.+*?()|[]{}^$#&-~")


def escape_regex(text: str) -> str:
    """``text`` as a literal in llguidance's (Rust) regex syntax."""
    return "".join("\\" + c if c in _REGEX_META else c for c in text)


def grammar_source(structured: StructuredOutput, param: str = "response_format",
                   json_options: JsonOptions | None = None) -> str:
    """The llguidance grammar text of ``structured``; :class:`InvalidParameter` naming
    ``param`` when its spec is not even well-formed (bad JSON, empty choice list)."""
    kind, spec = structured.kind, structured.spec
    if kind is GuideKind.JSON:
        opts = json_options or JsonOptions()
        if spec == JSON_OBJECT_SPEC:  # OpenAI's json_object: bounded, see .json_object
            return llguidance.LLMatcher.grammar_from_lark(json_object_lark())
        try:
            schema = json.loads(spec)
        except ValueError as e:
            raise InvalidParameter(param, f"the JSON schema is not valid JSON: {e}") from e
        schema = bound_numbers(schema, opts.fraction_digits, opts.integer_digits,
                               opts.free_depth)
        try:
            overrides = ({} if opts.whitespace_pattern is None
                         else {"whitespace_pattern": opts.whitespace_pattern})
            return llguidance.LLMatcher.grammar_from_json_schema(
                schema, overrides=overrides)  # type: ignore[arg-type]
        except ValueError as e:
            raise InvalidParameter(param, f"the JSON schema is not a schema: {e}") from e
    if kind is GuideKind.REGEX:
        return llguidance.LLMatcher.grammar_from_regex(spec)
    if kind is GuideKind.CHOICE:
        choices = json.loads(spec)
        if not choices or not all(isinstance(c, str) for c in choices):
            raise InvalidParameter(param, "choice must be a non-empty list of strings")
        return llguidance.LLMatcher.grammar_from_regex(
            "(" + "|".join(escape_regex(c) for c in choices) + ")")
    if kind is GuideKind.GRAMMAR:
        try:
            text = any_to_lark(spec)
        except Exception as e:  # noqa: BLE001 - the converter's parse errors vary
            raise InvalidParameter(param, f"the GBNF grammar does not parse: {e}") from e
        return llguidance.LLMatcher.grammar_from_lark(text)
    raise InvalidParameter(param, f"unknown structured output kind {kind!r}")
