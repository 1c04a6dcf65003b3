"""compare_rounds: server labels with settings, and the table of rounds, medians, ratios."""

from __future__ import annotations

import pytest


def summary(tok_s: float, ttft_s: float) -> dict:
    return {"output_throughput": tok_s, "ttft_ms": {"p50": ttft_s * 1000}}


def test_labels_carry_environment_settings_and_flags():
    from compare_rounds import parse_label

    assert parse_label("hermes") == ("hermes", {}, [])
    assert parse_label("hermes+OMP_WAIT_POLICY=PASSIVE+A=b=c") == (
        "hermes", {"OMP_WAIT_POLICY": "PASSIVE", "A": "b=c"}, [])
    assert parse_label("hermes+--quantization=int8+A=b+--no-warmup") == (
        "hermes", {"A": "b"}, ["--quantization", "int8", "--no-warmup"])
    with pytest.raises(ValueError, match="KEY=VALUE"):
        parse_label("hermes+PASSIVE")


def test_table_has_each_round_the_medians_and_ratios_of_medians():
    from compare_rounds import table

    results = {"hermes": {"short@32": [summary(300, 1.0), summary(330, 1.2), summary(360, 0.9)]},
               "vllm": {"short@32": [summary(300, 1.5), summary(220, 1.2), summary(330, 1.8)]}}
    text = table(["short@32"], ["hermes", "vllm"], results)
    assert "| 2 | 330.0 | 1.200 | 220.0 | 1.200 |" in text
    assert "| median | 330.0 | 1.000 | 300.0 | 1.500 |" in text
    # ratio of the medians (330 / 300), each round's ratio, TTFT peer / hermes
    assert "tok/s 1.10x (per round 1.00, 1.50, 1.09)" in text
    assert "TTFT p50 1.50x" in text
