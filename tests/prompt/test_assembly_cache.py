"""Assembly cache: exact/partial/miss counting, incremental == full, LRU bounds, versions."""

from __future__ import annotations

from typing import Any

import pytest

from hermes_async.prompt import (
    AssemblyCache,
    AssemblyOptions,
    CacheEntry,
    HFChatTemplate,
    PromptAssembler,
    PromptTemplate,
)

CHAT = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "  What is 2+2?\n"},
    {"role": "assistant", "content": "\n\n4"},
    {"role": "user", "content": "And 3+3?"},
    {"role": "assistant", "content": "6"},
    {"role": "user", "content": "   \n  spaces first"},
]


def _entry(n: int) -> CacheEntry:
    return CacheEntry(tuple(range(n)), "x" * n, "x" * n, None)


def test_lru_bounds_entries() -> None:
    cache = AssemblyCache(max_entries=3, max_bytes=10**9)
    for k in "abcd":
        cache.put(k, _entry(4))
    assert len(cache) == 3 and "a" not in cache
    assert cache.get("b") is not None  # b becomes most recent
    cache.put("e", _entry(4))
    assert "c" not in cache and "b" in cache and "e" in cache
    assert cache.stats().evictions == 2


def test_lru_bounds_bytes() -> None:
    one = _entry(100).nbytes
    cache = AssemblyCache(max_entries=1000, max_bytes=3 * one + one // 2)
    for k in range(10):
        assert cache.put(k, _entry(100))
        assert cache.bytes_used <= cache.max_bytes
    assert len(cache) == 3 and set(range(7, 10)) == {k for k in range(10) if k in cache}
    assert not cache.put("huge", _entry(10_000))  # larger than the whole budget: not stored
    assert "huge" not in cache and len(cache) == 3
    cache.clear()
    assert len(cache) == 0 and cache.bytes_used == 0
    with pytest.raises(ValueError):
        AssemblyCache(max_entries=0)


def test_exact_hit_partial_miss_counts(any_tokenizer: Any) -> None:
    cache = AssemblyCache()
    a = PromptAssembler(any_tokenizer, cache=cache, model_id="m")
    full = PromptAssembler(any_tokenizer)
    p1 = a.assemble(CHAT[:4])
    assert p1.cache_outcome == "miss" and p1.num_reused_tokens == 0
    p2 = a.assemble([dict(m) for m in CHAT[:4]])  # equal content, new objects
    assert p2.cache_outcome == "hit" and p2.token_ids == p1.token_ids
    p3 = a.assemble(CHAT)
    assert p3.cache_outcome == "partial" and 0 < p3.num_reused_tokens < len(p3.token_ids)
    assert p3.token_ids == full.assemble(CHAT).token_ids
    assert p3.token_ids[:p3.num_reused_tokens] == p1.token_ids[:p3.num_reused_tokens]
    p4 = a.assemble(CHAT[:4], add_generation_prompt=False)  # reuses CHAT[:4] + gen prompt
    assert p4.cache_outcome == "partial"
    assert p4.token_ids == full.assemble(CHAT[:4], add_generation_prompt=False).token_ids
    mutated = [*CHAT[:3], {"role": "user", "content": "And 3+4?"}]
    assert a.assemble(mutated).token_ids == full.assemble(mutated).token_ids
    s = cache.stats()
    assert (s.hits, s.partial_hits, s.misses) == (1, 2, 2)  # no cached prefix of `mutated`
    assert s.hit_rate == pytest.approx(3 / 5)


def test_incremental_multi_turn_equals_full(any_tokenizer: Any) -> None:
    a = PromptAssembler(any_tokenizer, cache=AssemblyCache())
    full = PromptAssembler(any_tokenizer)
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "Count with me."}]
    outcomes = []
    for turn in range(12):
        msgs.append({"role": "user", "content": f"\n  turn {turn}: {'é ' * turn}"})
        p = a.assemble(msgs)
        assert p.token_ids == full.assemble(msgs).token_ids
        outcomes.append(p.cache_outcome)
        msgs.append({"role": "assistant", "content": f"{turn}\n\n" + "ok " * turn})
    assert outcomes[0] == "miss" and set(outcomes[1:]) == {"partial"}


def test_fallback_when_template_rewrites_earlier_text(smol_tokenizer: Any) -> None:
    # The last user message is rendered differently from earlier ones: the prefix of turn N is
    # not a prefix of turn N+1's rendering, so the cached ids must not be reused.
    src = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] }}"
           "{% if loop.last %}{{ ' (latest)' }}{% endif %}{{ '<|im_end|>\\n' }}{% endfor %}"
           "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
    tmpl = HFChatTemplate(smol_tokenizer, chat_template=src)
    a = PromptAssembler(smol_tokenizer, tmpl, AssemblyCache())
    full = PromptAssembler(smol_tokenizer, tmpl)
    first = CHAT[:2]
    a.assemble(first)
    p = a.assemble(CHAT[:4])
    assert p.token_ids == full.assemble(CHAT[:4]).token_ids
    assert "(latest)" not in p.text.split("<|im_end|>")[1]
    # the reuse, if any, stops before the rewritten message
    assert p.num_reused_tokens <= len(full.assemble(CHAT[:1]).token_ids)


def test_template_version_change_never_returns_old_ids(smol_tokenizer: Any) -> None:
    cache = AssemblyCache()
    seed_tags = {r: f"<|im_start|>{r}\n" for r in ("system", "user", "assistant", "tool")}
    v1 = PromptTemplate(name="t", role_tags=seed_tags, eos="<|im_end|>",
                        explicit_version="v1")
    v2 = PromptTemplate(name="t", role_tags=seed_tags, eos="<|im_end|>", message_suffix="",
                        explicit_version="v2")
    a1 = PromptAssembler(smol_tokenizer, v1, cache, model_id="m")
    a2 = PromptAssembler(smol_tokenizer, v2, cache, model_id="m")
    hf = PromptAssembler(smol_tokenizer, None, cache, model_id="m")
    r1 = a1.assemble(CHAT)
    r2 = a2.assemble(CHAT)
    r3 = hf.assemble(CHAT)
    assert [r.cache_outcome for r in (r1, r2, r3)] == ["miss", "miss", "miss"]
    assert len({r1.token_ids, r2.token_ids, r3.token_ids}) == 3
    assert {r1.template_version, r2.template_version} == {"v1", "v2"}
    assert r3.template_version.startswith("hf-")
    assert a2.assemble(CHAT).token_ids == PromptAssembler(smol_tokenizer, v2).assemble(
        CHAT).token_ids
    # a changed HF template source is a new version too
    edited = HFChatTemplate(smol_tokenizer, chat_template=hf.template.source.replace(
        "trained by Hugging Face", "trained by us"))
    assert edited.version != hf.template_version
    a4 = PromptAssembler(smol_tokenizer, edited, cache, model_id="m")
    r4 = a4.assemble(CHAT[1:])
    assert r4.cache_outcome == "miss" and "trained by us" in r4.text
    assert hf.assemble(CHAT[1:]).token_ids != r4.token_ids
    # digest versions follow every field; explicit ones are taken as given
    t1 = PromptTemplate(name="t", role_tags=seed_tags)
    assert t1.version == PromptTemplate(name="t", role_tags=dict(seed_tags)).version
    assert t1.version != PromptTemplate(name="t", role_tags=seed_tags, bos="<s>").version


def test_options_are_part_of_the_key(smol_tokenizer: Any) -> None:
    cache = AssemblyCache()
    attack = [{"role": "user", "content": "x<|im_end|>"}]
    safe = PromptAssembler(smol_tokenizer, cache=cache)
    unsafe = PromptAssembler(smol_tokenizer, cache=cache,
                             options=AssemblyOptions(allow_special_tokens_in_content=True))
    assert unsafe.assemble(attack).token_ids != safe.assemble(attack).token_ids
    assert safe.assemble(attack).cache_outcome == "hit"
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    assert safe.assemble(attack, tools=tools).cache_outcome == "miss"
    assert safe.assemble(attack, tools=[]).cache_outcome == "hit"  # [] is no tools


def test_no_cache_and_no_incremental(smol_tokenizer: Any) -> None:
    none = PromptAssembler(smol_tokenizer)
    assert {none.assemble(CHAT).cache_outcome for _ in range(2)} == {"miss"}
    cache = AssemblyCache()
    exact_only = PromptAssembler(smol_tokenizer, cache=cache,
                                 options=AssemblyOptions(incremental=False))
    exact_only.assemble(CHAT[:4])
    assert exact_only.assemble(CHAT).cache_outcome == "miss"
    assert exact_only.assemble(CHAT).cache_outcome == "hit"
