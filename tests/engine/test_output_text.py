"""OutputText: detokenization then stop strings, token by token, on the default tokenizer."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hermes_async.engine.output_text import Delta, OutputText
from tests.engine.test_stop_strings import expected_output

pytestmark = pytest.mark.slow  # the real default tokenizer

TEXT = st.text(st.sampled_from("ab \n.日本🎉👍🏽é"), max_size=30)


def generate(out: OutputText, ids: list[int]) -> list[Delta]:
    deltas = []
    for t in ids:
        deltas.append(out.append(t))
        if deltas[-1].stopped:
            return deltas
    deltas.append(out.finish())
    return deltas


@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=TEXT, data=st.data())
def test_output_is_decoded_text_cut_at_earliest_stop(smol_tokenizer: Any, text: str,
                                                     data: st.DataObject) -> None:
    # Stops drawn from the text itself (so they match, often across token boundaries).
    slices = st.tuples(st.integers(0, len(text)), st.integers(1, 4)).map(
        lambda p: text[p[0]:p[0] + p[1]])
    stops = data.draw(st.lists(st.one_of(slices, st.text("ab🎉", max_size=3)), max_size=3))
    ids = smol_tokenizer.encode(text, add_special_tokens=False)
    out = OutputText(smol_tokenizer, stop=stops)
    deltas = generate(out, ids)
    want, stop = expected_output(smol_tokenizer.decode(ids), stops)
    assert "".join(d.text for d in deltas) == out.text == want
    assert out.finished and out.stop_reason == stop
    assert deltas[-1].stopped == (stop is not None) and deltas[-1].stop_reason == stop
    assert not any("\ufffd" in d.text for d in deltas)
    assert sum(d.stopped for d in deltas) <= 1


def test_stop_split_across_tokens_and_chars(smol_tokenizer: Any) -> None:
    ids = smol_tokenizer.encode("The answer: 42 🎉🎉 then more text", add_special_tokens=False)
    out = OutputText(smol_tokenizer, stop=["2 🎉🎉 t"])
    deltas = generate(out, ids)
    assert deltas[-1] == Delta("", True, "2 🎉🎉 t") or deltas[-1].stopped
    assert out.text == "The answer: 4"
    assert out.num_tokens < len(ids)  # generation stops as soon as the stop string completes
    with pytest.raises(RuntimeError):
        out.append(ids[-1])
    assert out.finish() == Delta("", True, "2 🎉🎉 t")


def test_eos_and_specials(smol_tokenizer: Any) -> None:
    prompt = smol_tokenizer.encode("<|im_start|>assistant\n", add_special_tokens=False)
    ids = smol_tokenizer.encode("Hi!<|im_end|>", add_special_tokens=False)
    out = OutputText(smol_tokenizer, prompt)
    assert [d.text for d in generate(out, ids)] == ["Hi", "!", "", ""]
    out = OutputText(smol_tokenizer, prompt, skip_special_tokens=False)
    generate(out, ids)
    assert out.text == "Hi!<|im_end|>" and out.stop_reason is None


def test_finish_releases_held_text_and_can_still_stop(smol_tokenizer: Any) -> None:
    ids = smol_tokenizer.encode("go 1xab", add_special_tokens=False)
    out = OutputText(smol_tokenizer, stop=["xabyz"])
    assert "".join(out.append(t).text for t in ids) == "go 1"
    assert out.finish() == Delta("xab", False, None)
    assert out.text == "go 1xab" and out.finish() == Delta("", False, None)
    # "ab" is complete but "xabyz" might still start earlier: decided only at finish.
    out = OutputText(smol_tokenizer, stop=["xabyz", "ab"])
    assert not any(out.append(t).stopped for t in ids)
    assert out.finish() == Delta("x", True, "ab")
    assert out.text == "go 1x"
    # A dangling partial character is released once, as U+FFFD.
    partial = smol_tokenizer.encode("ok🎉", add_special_tokens=False)[:-1]
    out = OutputText(smol_tokenizer)
    generate(out, partial)
    assert out.text == smol_tokenizer.decode(partial) == "ok\ufffd"
