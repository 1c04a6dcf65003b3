"""``hermes-async doctor``: offline prefix-reuse, dynamic-field and tool-role report."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hermes_async.cli import main
from hermes_async.observe.doctor_roles import RoleCheck
from hermes_async.observe.doctor_simulator import common_prefix_len

BODY = "".join(f"Rule {i}: answer questions about product {i} politely, in short steps. "
               for i in range(20))
QUESTIONS = ["What is the capital of France?", "How do I reset my password?",
             "Why is the sky blue?", "Who wrote Hamlet?"]
CHATML = Path(__file__).resolve().parents[2] / "configs" / "templates" / "chatml.toml"


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows),
                    encoding="utf-8")
    return path


def chat(system: str, question: str, **extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "system", "content": system},
                                       {"role": "user", "content": question}], **extra}


TOOL_CHAT = {"messages": [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": "{}"}},
        {"id": "c2", "type": "function", "function": {"name": "time", "arguments": "{}"}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "21C"},
    {"role": "tool", "tool_call_id": "c2", "content": "10:00"},
]}


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(["doctor", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_dynamic_date_in_system_prompt(default_model_dir: Path, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    rows = [chat(f"Today is 2026-01-{k + 1:02d}. You are a support bot. " + BODY,
                 QUESTIONS[k % 4]) for k in range(12)]
    f = write_jsonl(tmp_path / "date.jsonl", rows)
    rc, out, _ = run(capsys, str(f), "--model", str(default_model_dir))
    assert rc == 0
    assert "block size 32 (derived: 3 KV heads x 64)" in out
    assert "prompts: 12," in out
    dyn = out.split("== Dynamic fields")[1].split("== Short prompts")[0]
    assert "11 requests" in dyn and "namespace 'default'" in dyn
    assert "Today is 2026-01-1[2]. You are" in dyn and "Today is 2026-01-1[1]. You are" in dyn
    assert "move dynamic fields" in dyn and "last user message" in dyn
    assert "advice: multi-turn applications typically reuse 60-80%" in out

    rc, out, _ = run(capsys, str(f), "--model", str(default_model_dir), "--json")
    doc = json.loads(out)
    [point] = doc["divergence"]
    assert point["requests"] == 11 and point["tokens_lost"] > 11 * 250
    assert point["text_this"] == "2" and point["text_other"] == "1"
    assert point["last_seen"] == 12  # the line of its latest request
    assert "2026-01-12. You are" in point["excerpt_this"]
    assert doc["reusable_share"] < 0.2
    assert [x["kind"] for x in doc["findings"]][:2] == ["dynamic_field", "low_reuse"]


def test_fixed_system_prompt(default_model_dir: Path, tmp_path: Path,
                             capsys: pytest.CaptureFixture[str]) -> None:
    rows = [chat("You are a support bot. " + BODY, QUESTIONS[k % 4] + " " * (k % 3))
            for k in range(10)]
    rows.append({"prompt": "Hi"})
    f = write_jsonl(tmp_path / "fixed.jsonl", rows)
    rc, out, _ = run(capsys, str(f), "--model", str(default_model_dir), "--json")
    assert rc == 0
    doc = json.loads(out)
    assert doc["divergence"] == [] and doc["reusable_share"] > 0.8
    assert doc["served_tokens_per_prompt"]["p50"] >= 288
    assert doc["served_tokens_per_prompt"]["p50"] % 32 == 0
    assert doc["shared_prefix_tokens"]["p50"] >= doc["served_tokens_per_prompt"]["p50"]
    assert doc["short_prompts"] == {"count": 1, "lines": [11]}
    assert [x["kind"] for x in doc["findings"]] == ["short_prompts"]
    rc, out, _ = run(capsys, str(f), "--model", str(default_model_dir))
    assert "none: no prompt forks the prefix tree" in out
    assert "1 prompt of at most 32 tokens (line 11)" in out


def test_tool_roles_counted(default_model_dir: Path, tmp_path: Path,
                            capsys: pytest.CaptureFixture[str]) -> None:
    f = write_jsonl(tmp_path / "tools.jsonl", [TOOL_CHAT, chat("sys", "hi")])
    rc, out, _ = run(capsys, str(f), "--model", str(default_model_dir), "--json")
    roles = json.loads(out)["roles"]
    assert rc == 0
    assert (roles["chat_prompts"], roles["prompts_with_tools"], roles["tool_messages"],
            roles["tool_calls"], roles["tool_tags"]) == (2, 1, 2, 2, 2)
    assert roles["problems"] == []
    rc, out, _ = run(capsys, str(f), "--model", str(default_model_dir))
    assert "tool messages 2, tool calls 2, tool tags 2: OK" in out


def test_tool_output_rendered_as_user_is_flagged(default_model_dir: Path, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(CHATML.read_text(encoding="utf-8").replace(
        'tool = "<|im_start|>tool\\n"', 'tool = "<|im_start|>user\\n"'), encoding="utf-8")
    assert bad.read_text(encoding="utf-8") != CHATML.read_text(encoding="utf-8")
    f = write_jsonl(tmp_path / "tools.jsonl", [chat("sys", "hi"), TOOL_CHAT])
    rc, out, _ = run(capsys, str(f), "--model", str(default_model_dir), "--template", str(bad))
    assert rc == 0
    assert "MISMATCH" in out
    assert ("line 2: tool output rendered as user turns (tool messages 2, tool tags 0, tool "
            "calls 2, user messages 1, user tags 3)") in out
    assert "never as user turns" in out


def test_role_check_rules() -> None:
    assert RoleCheck(2, 2, 2, 1, 1).problem is None
    assert RoleCheck(1, 1, 0, 1, 2).problem == "tool_as_user"
    assert RoleCheck(2, 2, 1, 1, 1).problem == "tool_tags"
    assert RoleCheck(1, 2, 1, 1, 1).problem == "tool_calls"
    assert RoleCheck(0, 0, 0, 3, 3).problem is None


def test_malformed_line_exits_2_with_line_number(default_model_dir: Path, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "bad.jsonl"
    f.write_text(json.dumps(chat("s", "q")) + "\n\n" + '{"messages": [}\n', encoding="utf-8")
    rc, out, err = run(capsys, str(f), "--model", str(default_model_dir))
    assert rc == 2 and out == ""
    assert "line 3: invalid JSON" in err and str(f) in err
    f.write_text(json.dumps({"messages": [{"role": "user"}]}) + "\n", encoding="utf-8")
    rc, _, err = run(capsys, str(f), "--model", str(default_model_dir))
    assert rc == 2 and "line 1:" in err and "messages[0].content" in err
    f.write_text(json.dumps({"input": "x"}) + "\n", encoding="utf-8")
    rc, _, err = run(capsys, str(f), "--model", str(default_model_dir))
    assert rc == 2 and "line 1: expected a JSON object with 'messages' or 'prompt'" in err
    rc, _, err = run(capsys, str(tmp_path / "missing.jsonl"), "--model", str(default_model_dir))
    assert rc == 2 and "cannot read" in err


def test_namespaces_block_size_and_raw_prompts(default_model_dir: Path, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    rows = [{"prompt": "You are a bot. " + BODY + q, "user": u}
            for u in ("alice", "bob") for q in QUESTIONS]
    rows.append({"prompt": [1, 2, 3]})
    f = write_jsonl(tmp_path / "raw.jsonl", rows)
    rc, out, _ = run(capsys, str(f), "--model", str(default_model_dir), "--json",
                     "--namespace-key", "user", "--block-size", "16", "--top", "3")
    doc = json.loads(out)
    assert rc == 0 and doc["block_size"] == 16 and doc["block_size_source"] == "--block-size"
    assert set(doc["namespaces"]) == {"alice", "bob", "default"}
    alice, bob = doc["namespaces"]["alice"], doc["namespaces"]["bob"]
    assert alice["prompts"] == bob["prompts"] == 4
    assert alice["served_tokens"] == bob["served_tokens"] > 0  # no sharing across namespaces
    assert doc["roles"]["chat_prompts"] == 0
    rc, out, _ = run(capsys, str(f), "--model", str(default_model_dir), "--namespace-key",
                     "user")
    assert "namespace 'alice': 4 prompts" in out


def test_block_size_from_config(default_model_dir: Path, tmp_path: Path,
                                capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[model]\npath = "{default_model_dir}"\n[cache]\nblock_size = 16\n',
                   encoding="utf-8")
    f = write_jsonl(tmp_path / "one.jsonl", [chat("s", "q")])
    rc, out, _ = run(capsys, str(f), "--config", str(cfg), "--json")
    doc = json.loads(out)
    assert rc == 0 and (doc["block_size"], doc["block_size_source"]) == (16, "config")
    assert doc["model"] == str(default_model_dir)
    cfg.write_text("[cache]\nblock_size = 0\n", encoding="utf-8")
    rc, _, err = run(capsys, str(f), "--config", str(cfg))
    assert rc == 2 and "block_size" in err


def test_common_prefix_len() -> None:
    assert common_prefix_len((1, 2, 3), (1, 2, 4, 5)) == 2
    assert common_prefix_len((), (1,)) == 0
    assert common_prefix_len((1, 2), (1, 2)) == 2
