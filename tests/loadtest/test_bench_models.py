"""bench_models' merging of several starts of one server and its table cells."""

from __future__ import annotations

from bench_models import merge_starts, report, spread


def _res(c1: float, c8: float, load: float, rss: int) -> dict[str, object]:
    return {"prefill_tok_s": 100.0 + c1, "decode_c1_tok_s": c1, "decode_c8_tok_s": c8,
            "load_s": load, "rss_bytes": rss, "ttft_short_s": 0.1}


def test_the_best_start_of_each_rate_with_every_start_kept():
    merged = merge_starts([_res(20.0, 90.0, 30.0, 5), None, _res(25.0, 80.0, 20.0, 7)])
    assert merged is not None
    assert merged["decode_c1_tok_s"] == 25.0 and merged["decode_c8_tok_s"] == 90.0
    assert merged["decode_c1_tok_s_starts"] == [20.0, 25.0]
    assert merged["load_s"] == 20.0 and merged["rss_bytes"] == 7 and merged["starts"] == 2
    assert spread(merged, "decode_c1_tok_s") == "25.0 (20.0-25.0)"
    assert merge_starts([None, None]) is None


def test_one_start_shows_its_value_alone_and_ratios_divide_hermes_by_the_row():
    rows = [{"model": "m", "server": "hermes", "floor_tok_s": 10.0,
             "res": merge_starts([_res(30.0, 120.0, 1.0, 2 << 30)])},
            {"model": "m", "server": "llamacpp", "floor_tok_s": 10.0,
             "res": _res(20.0, 40.0, 1.0, 1 << 30)},
            {"model": "m", "server": "vllm", "floor_tok_s": 10.0, "res": None}]
    table = report(rows, "cpu", 30e9)
    assert "| m | hermes | 1 | 2.0 | 130 | 30.0 | 120.0 | 3.00 |  |  |" in table
    assert "| 1.50x | 3.00x |" in table
    assert "| m | vllm | failed |" in table
