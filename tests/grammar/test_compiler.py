"""The compiled-grammar cache and the per-sequence constraint, with the default model's
tokenizer: masks checked against the tokens' own text (the oracle: Python's ``re`` and
``json``), one compile for concurrent equal requests, compiles off the event loop, errors as
``InvalidParameter``."""

from __future__ import annotations

import asyncio
import json
import re
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hermes_async.builder import grammar_compiler
from hermes_async.grammar import GrammarCompiler
from hermes_async.grammar.json_bounds import bound_numbers
from hermes_async.types import GuideKind, InvalidParameter, StructuredOutput


@pytest.fixture(scope="module")
def tokenizer(default_model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(default_model_dir))


@pytest.fixture
def compiler(tokenizer: Any) -> GrammarCompiler:
    return grammar_compiler(tokenizer, len(tokenizer), "smol")


def allowed_ids(constraint: Any) -> list[int]:
    row = np.zeros(-(-constraint.vocab_size // 32), dtype=np.int32)
    constraint.fill_bitmask(row)
    bits = np.unpackbits(row.view(np.uint8), bitorder="little")
    return [int(t) for t in np.flatnonzero(bits[:constraint.vocab_size])]


def test_regex_mask_allows_exactly_the_tokens_that_keep_a_match_possible(
        compiler: GrammarCompiler, tokenizer: Any) -> None:
    compiled = asyncio.run(compiler.compile(StructuredOutput(GuideKind.REGEX, "[0-9]{2,4}")))
    c = compiled.new_constraint()
    texts = {t: tokenizer.decode([t]) for t in allowed_ids(c)}
    assert texts and all(re.fullmatch(r"[0-9]{1,4}", s) for s in texts.values())
    digits = [t for t in range(len(tokenizer)) if re.fullmatch(r"[0-9]{1,4}",
                                                               tokenizer.decode([t]) or "x")]
    assert set(digits) <= set(texts)  # nothing that could start a match is missing
    for tok in tokenizer.encode("2026", add_special_tokens=False):
        assert c.accept(tok)
    assert c.is_finished  # 4 digits: only EOS may follow
    c2 = compiled.new_constraint()  # each sequence its own state
    assert len(allowed_ids(c2)) == len(texts)
    assert not c2.accept(tokenizer.encode("x", add_special_tokens=False)[0])
    assert c2.error


def test_equal_concurrent_requests_compile_once_off_the_loop(
        compiler: GrammarCompiler, monkeypatch: pytest.MonkeyPatch) -> None:
    threads: list[int] = []
    real = compiler.compile_now

    def spy(*args: Any) -> Any:
        threads.append(threading.get_ident())
        return real(*args)

    monkeypatch.setattr(compiler, "compile_now", spy)
    spec = StructuredOutput(GuideKind.JSON, json.dumps({"type": "object", "properties": {
        "a": {"type": "integer"}}, "required": ["a"]}))

    async def run() -> list[Any]:
        loop_thread = threading.get_ident()
        out = await asyncio.gather(*[compiler.compile(spec) for _ in range(5)])
        assert loop_thread not in threads
        return out

    results = asyncio.run(run())
    assert len(threads) == 1 and all(r is results[0] for r in results)
    stats = compiler.stats()
    assert (stats.misses, stats.hits, stats.size) == (1, 4, 1)
    asyncio.run(compiler.compile(spec))
    assert compiler.stats().hits == 5


def test_lru_keeps_capacity_entries(tokenizer: Any) -> None:
    small = grammar_compiler(tokenizer, len(tokenizer), "smol")
    small.capacity = 2
    specs = [StructuredOutput(GuideKind.REGEX, f"a{i}") for i in range(3)]
    for s in specs:
        asyncio.run(small.compile(s))
    asyncio.run(small.compile(specs[0]))  # evicted: compiled again
    assert small.stats().misses == 4 and small.stats().size == 2


@pytest.mark.parametrize(("kind", "spec", "needle"), [
    (GuideKind.JSON, '{"type": "nope"}', "nope"),
    (GuideKind.JSON, "{bad", "not valid JSON"),
    (GuideKind.REGEX, "a(b", "unclosed"),
    (GuideKind.GRAMMAR, "start: missing_rule", "missing_rule"),
    (GuideKind.GRAMMAR, "root ::= (", "GBNF"),
    (GuideKind.CHOICE, "[]", "non-empty"),
])
def test_invalid_constraints_raise_invalid_parameter(compiler: GrammarCompiler, kind: GuideKind,
                                                     spec: str, needle: str) -> None:
    with pytest.raises(InvalidParameter) as e:
        asyncio.run(compiler.compile(StructuredOutput(kind, spec), param="guided_x"))
    assert e.value.param == "guided_x" and needle in str(e.value)
    assert compiler.stats().failures == 1 and compiler.stats().size == 0


def test_gbnf_and_choice(compiler: GrammarCompiler, tokenizer: Any) -> None:
    for s in (StructuredOutput(GuideKind.GRAMMAR, 'root ::= "yes" | "no"'),
              StructuredOutput(GuideKind.CHOICE, json.dumps(["yes", "no"]))):
        c = asyncio.run(compiler.compile(s)).new_constraint()
        for tok in tokenizer.encode("no", add_special_tokens=False):
            assert c.accept(tok)
        assert c.is_finished


def test_number_bounds_narrow_never_widen() -> None:
    import jsonschema

    schema = {"type": "object", "properties": {"x": {"type": "number"},
                                               "n": {"type": "integer", "maximum": 5}}}
    bounded = bound_numbers(schema, 6, 15)
    assert schema["properties"]["x"] == {"type": "number"}  # not modified
    assert bounded["properties"]["x"]["multipleOf"] == 1e-6
    assert bounded["properties"]["n"]["maximum"] == 5  # the schema's own bound kept
    for doc in ({"x": 1.5, "n": 3}, {"x": -123456.000001, "n": -7}):
        jsonschema.validate(doc, bounded)
        jsonschema.validate(doc, schema)
