"""IncrementalDetokenizer: the pieces it emits add up to the tokenizer's own decode, for the
real default tokenizer (byte-level BPE) and a SentencePiece-style one, with broken UTF-8 held
back, special tokens skipped, and a constant-size decode window per token."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from hermes_async.engine.detokenizer import IncrementalDetokenizer
from tests.engine.conftest import LLAMA_PIECES

FFFD = "\ufffd"
SETTINGS = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])
# Text with plenty of multi-byte characters (CJK, emoji, combining marks), no lone surrogates.
TEXT = st.text(
    alphabet=st.one_of(
        st.sampled_from("ab ,.\n\t 日本語中文한국어éü🎉👍🏽🧑\u200d🚀🇫🇷𝔘—“”"),
        st.characters(blacklist_categories=("Cs",), blacklist_characters=FFFD),
    ),
    max_size=40,
)


def run(tok: Any, ids: list[int], prompt: list[int] | None = None,
        skip: bool = True) -> list[str]:
    detok = IncrementalDetokenizer(tok, prompt or [], skip_special_tokens=skip)
    pieces = [detok.add(t) for t in ids]
    pieces.append(detok.flush())
    return pieces


def assert_no_new_fffd(pieces: list[str], expected: str) -> None:
    if FFFD not in expected:
        assert not any(FFFD in p for p in pieces), pieces


# ---- the default model's tokenizer (byte-level BPE) -------------------------------------------

@pytest.mark.slow
@SETTINGS
@given(text=TEXT)
def test_smol_text_roundtrip(smol_tokenizer: Any, text: str) -> None:
    ids = smol_tokenizer.encode(text, add_special_tokens=False)
    pieces = run(smol_tokenizer, ids)
    expected = smol_tokenizer.decode(ids, skip_special_tokens=True)
    assert "".join(pieces) == expected
    assert_no_new_fffd(pieces, expected)


@pytest.mark.slow
@SETTINGS
@given(data=st.data(), skip=st.booleans())
def test_smol_random_ids_match_full_decode(smol_tokenizer: Any, smol_tricky_ids: list[int],
                                           data: st.DataObject, skip: bool) -> None:
    vocab = smol_tokenizer.backend_tokenizer.get_vocab_size()
    ids = data.draw(st.lists(st.one_of(st.sampled_from(smol_tricky_ids),
                                       st.integers(0, vocab - 1)), max_size=30))
    pieces = run(smol_tokenizer, ids, skip=skip)
    expected = smol_tokenizer.decode(ids, skip_special_tokens=skip)
    assert "".join(pieces) == expected
    assert_no_new_fffd(pieces, expected)


@pytest.mark.slow
@SETTINGS
@given(prompt_text=TEXT, data=st.data())
def test_smol_output_after_prompt(smol_tokenizer: Any, smol_tricky_ids: list[int],
                                  prompt_text: str, data: st.DataObject) -> None:
    prompt = smol_tokenizer.encode(prompt_text, add_special_tokens=False)
    ids = data.draw(st.lists(st.sampled_from(smol_tricky_ids), max_size=20))
    before = smol_tokenizer.decode(prompt, skip_special_tokens=True)
    full = smol_tokenizer.decode(prompt + ids, skip_special_tokens=True)
    assert full.startswith(before)
    pieces = run(smol_tokenizer, ids, prompt)
    assert "".join(pieces) == full[len(before):]
    assert_no_new_fffd(pieces, full[len(before):])


@pytest.mark.slow
def test_smol_emoji_split_across_tokens_is_held_back(smol_tokenizer: Any) -> None:
    ids = smol_tokenizer.encode("ok 🎉!", add_special_tokens=False)
    pieces = run(smol_tokenizer, ids)
    assert "".join(pieces) == "ok 🎉!"
    assert "🎉" in pieces or any(p.endswith("🎉") or p.startswith("🎉") for p in pieces)
    assert pieces.count("") >= 1  # at least one step held a partial character back
    # A dangling partial character comes out once, as the tokenizer renders it.
    partial = smol_tokenizer.encode("🎉", add_special_tokens=False)[:-1]
    pieces = run(smol_tokenizer, partial)
    assert pieces[:-1] == [""] * len(partial)
    assert pieces[-1] == smol_tokenizer.decode(partial) == FFFD


@pytest.mark.slow
def test_smol_special_tokens(smol_tokenizer: Any) -> None:
    ids = smol_tokenizer.encode("Hi there<|im_end|>\n<|im_start|>x", add_special_tokens=False)
    assert 2 in ids and 1 in ids
    assert "".join(run(smol_tokenizer, ids)) == "Hi there\nx"
    assert "".join(run(smol_tokenizer, ids, skip=False)) == "Hi there<|im_end|>\n<|im_start|>x"


@pytest.mark.slow
def test_smol_chat_prompt_context(smol_tokenizer: Any) -> None:
    prompt = smol_tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi"}], add_generation_prompt=True, tokenize=True,
        return_dict=False)
    out = smol_tokenizer.encode("Hello! 你好 🎉", add_special_tokens=False) + [2]
    assert "".join(run(smol_tokenizer, out, list(prompt))) == "Hello! 你好 🎉"


@pytest.mark.slow
def test_bare_tokenizers_object(default_model_dir: Any, smol_tokenizer: Any) -> None:
    from tokenizers import Tokenizer

    bare = Tokenizer.from_file(str(default_model_dir / "tokenizer.json"))
    ids = smol_tokenizer.encode("日本語 🎉<|im_end|>", add_special_tokens=False)
    assert "".join(run(bare, ids)) == "日本語 🎉"
    assert "".join(run(bare, ids, skip=False)) == "日本語 🎉<|im_end|>"


class _SlowTokenizer:
    """A tokenizer without a Rust backend: only ``decode`` and ``all_special_ids``."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.all_special_ids = inner.all_special_ids

    def decode(self, ids: list[int], skip_special_tokens: bool = False,
               clean_up_tokenization_spaces: bool | None = None) -> str:
        return self._inner.decode(ids, skip_special_tokens=skip_special_tokens,
                                  clean_up_tokenization_spaces=clean_up_tokenization_spaces)


@pytest.mark.slow
def test_tokenizer_without_backend(smol_tokenizer: Any) -> None:
    ids = smol_tokenizer.encode("<|im_start|>ça 🎉 va", add_special_tokens=False)
    assert "".join(run(_SlowTokenizer(smol_tokenizer), ids)) == "ça 🎉 va"


class _CountingBackend:
    """Wraps a tokenizers.Tokenizer and records the length of every decode."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.lengths: list[int] = []

    def get_added_tokens_decoder(self) -> Any:
        return self._inner.get_added_tokens_decoder()

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        self.lengths.append(len(ids))
        return self._inner.decode(ids, skip_special_tokens=skip_special_tokens)


@pytest.mark.slow
def test_cost_per_token_is_constant(smol_tokenizer: Any) -> None:
    from tests.engine.conftest import TRICKY_TEXT

    ids = smol_tokenizer.encode(TRICKY_TEXT * 40, add_special_tokens=False)[:2000]
    prompt = smol_tokenizer.encode("Say hello.", add_special_tokens=False)
    counting = _CountingBackend(smol_tokenizer.backend_tokenizer)
    detok = IncrementalDetokenizer(counting, prompt)
    assert counting.lengths == [len(prompt)]  # the prompt's tail (up to 4 tokens) seeds it
    counting.lengths.clear()
    pieces = [detok.add(t) for t in ids] + [detok.flush()]
    decode = smol_tokenizer.backend_tokenizer.decode
    assert "".join(pieces) == decode(prompt + ids, skip_special_tokens=True)[len("Say hello."):]
    assert len(ids) == 2000
    assert max(counting.lengths) <= 8  # the window never grows with the output
    assert len(counting.lengths) <= 2 * len(ids) + 2


@pytest.mark.slow
def test_garbage_stream_of_partial_bytes_stays_constant_cost(smol_tokenizer: Any) -> None:
    from hermes_async.engine.detokenizer import MAX_HELD_TOKENS

    backend = smol_tokenizer.backend_tokenizer
    lone = next(i for i in range(backend.get_vocab_size())
                if backend.decode([i, i, i]) == FFFD * 3)  # a lone continuation byte
    ids = [lone] * 300 + smol_tokenizer.encode(" ok", add_special_tokens=False)
    counting = _CountingBackend(backend)
    pieces = run(counting, ids)
    assert "".join(pieces) == backend.decode(ids) == FFFD * 300 + " ok"
    assert max(counting.lengths) <= MAX_HELD_TOKENS + 1


def test_add_after_flush_raises() -> None:
    class Tok:
        all_special_ids: list[int] = []

        def decode(self, ids: list[int], **_: Any) -> str:
            return "".join(chr(97 + i) for i in ids)

    detok = IncrementalDetokenizer(Tok())
    assert detok.add(0) == "a" and detok.add(1) == "b"
    assert detok.flush() == "" and detok.flush() == "" and detok.finished
    with pytest.raises(RuntimeError):
        detok.add(2)


# ---- a SentencePiece-style tokenizer (leading space depends on the previous token) -----------

def llama_units(tok: Any) -> st.SearchStrategy[list[int]]:
    """Valid token sequences: pieces, special tokens, and whole characters as byte tokens."""
    piece_ids = tok.convert_tokens_to_ids(LLAMA_PIECES)
    char_bytes = st.sampled_from("éü日語🎉👍🧑𝔘—ж").map(
        lambda c: tok.convert_tokens_to_ids([f"<0x{b:02X}>" for b in c.encode()]))
    unit = st.one_of(st.sampled_from(piece_ids).map(lambda i: [i]),
                     st.sampled_from([1, 2]).map(lambda i: [i]), char_bytes)
    return st.lists(unit, max_size=15).map(lambda units: [i for u in units for i in u])


@SETTINGS
@given(data=st.data(), skip=st.booleans())
def test_llama_valid_sequences_match_full_decode(llama_tokenizer: Any, data: st.DataObject,
                                                 skip: bool) -> None:
    ids = data.draw(llama_units(llama_tokenizer))
    pieces = run(llama_tokenizer, ids, skip=skip)
    expected = llama_tokenizer.decode(ids, skip_special_tokens=skip)
    assert "".join(pieces) == expected
    assert not any(FFFD in p for p in pieces)


@SETTINGS
@given(data=st.data())
def test_llama_output_after_prompt_keeps_leading_space(llama_tokenizer: Any,
                                                       data: st.DataObject) -> None:
    prompt = data.draw(llama_units(llama_tokenizer))
    ids = data.draw(llama_units(llama_tokenizer))
    before = llama_tokenizer.decode(prompt, skip_special_tokens=True)
    full = llama_tokenizer.decode(prompt + ids, skip_special_tokens=True)
    assume(before and full.startswith(before))  # an all-special prompt gives no context
    assert "".join(run(llama_tokenizer, ids, prompt)) == full[len(before):]


def test_llama_first_token_space(llama_tokenizer: Any) -> None:
    ids = llama_tokenizer.convert_tokens_to_ids
    prompt = ids(["▁the", "▁world", "▁is", "▁"])  # "the world is " (trailing space)
    assert run(llama_tokenizer, ids(["▁Paris"]), prompt[:3]) == [" Paris", ""]
    assert run(llama_tokenizer, ids(["▁Paris"]), prompt[3:]) == ["Paris", ""]  # no context
    assert run(llama_tokenizer, ids(["▁Paris", "."]), prompt) == [" Paris", ".", ""]
    assert run(llama_tokenizer, ids(["Paris", "▁is"]), prompt) == ["Paris", " is", ""]
    assert run(llama_tokenizer, ids(["▁Paris", "▁is"])) == ["Paris", " is", ""]
    # Runs of "▁" and skipped specials between words keep their spaces.
    seq = ids(["▁Hello", "▁", "</s>", "▁", "world", "<s>", "▁▁", "▁is"])
    assert "".join(run(llama_tokenizer, seq)) == llama_tokenizer.decode(
        seq, skip_special_tokens=True) == "Hello  world   is"


@SETTINGS
@given(data=st.data())
def test_llama_invalid_bytes_never_leak_fffd(llama_tokenizer: Any, data: st.DataObject) -> None:
    """Random byte tokens (often invalid UTF-8): no crash, and a U+FFFD is emitted only when
    the full decode has one too (ByteFallback may count a bad run differently, documented)."""
    byte_ids = llama_tokenizer.convert_tokens_to_ids(["<0xE4>", "<0xB8>", "<0xAD>", "<0xF0>",
                                                      "<0x9F>", "<0x8E>", "<0x89>", "<0x41>"])
    pool = byte_ids + llama_tokenizer.convert_tokens_to_ids(["▁a", "b", "▁"])
    ids = data.draw(st.lists(st.sampled_from(pool), max_size=20))
    pieces = run(llama_tokenizer, ids)
    assert_no_new_fffd(pieces, llama_tokenizer.decode(ids, skip_special_tokens=True))
