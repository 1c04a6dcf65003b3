"""Every supported family served over HTTP (``serve --model DIR``'s app) and asked through
the official openai client gives transformers' greedy continuation: a tiny random model of each
family with the default model's tokenizer and chat template (its vocabulary), the prompt
rendered by ``apply_chat_template``, ``ignore_eos`` so that all tokens count."""

from __future__ import annotations

import shutil

import openai
import pytest
import torch

from tests.server.helpers import ServerThread, real_config
from tests.tiny_models import ARCHS, load_oracle, make_tiny_model

pytestmark = pytest.mark.slow
MESSAGES = [{"role": "user", "content": "Tell me about the sea."}]
NEW_TOKENS = 12


@pytest.fixture(scope="module")
def tokenizer_files(default_model_dir):
    return [default_model_dir / n for n in ("tokenizer.json", "tokenizer_config.json",
                                            "generation_config.json")]


@pytest.mark.parametrize("arch", ARCHS)
def test_each_family_served_answers_as_transformers(arch, tmp_path, tokenizer_files):
    from transformers import AutoTokenizer

    path = make_tiny_model(tmp_path / arch, arch, head_dim=32, vocab_size=49152)
    for f in tokenizer_files:
        shutil.copy(f, path / f.name)
    tokenizer = AutoTokenizer.from_pretrained(path)
    ids = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True,
                                        return_dict=False)
    with torch.no_grad():
        ref = load_oracle(path).generate(torch.tensor([ids]), max_new_tokens=NEW_TOKENS,
                                         do_sample=False, eos_token_id=None,
                                         pad_token_id=0)[0, len(ids):].tolist()
    config = real_config(path).replace(model={"dtype": "float32"})
    srv = ServerThread(config).start()
    try:
        client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="none", max_retries=0)
        out = client.chat.completions.create(
            model=client.models.list().data[0].id, messages=MESSAGES, max_tokens=NEW_TOKENS,
            temperature=0, extra_body={"ignore_eos": True, "skip_special_tokens": False})
        assert out.usage.completion_tokens == NEW_TOKENS
        assert out.choices[0].message.content == tokenizer.decode(ref)
    finally:
        srv.stop()


def test_a_gguf_file_served_answers_as_transformers_reads_it(tmp_path, default_model_dir,
                                                             monkeypatch):
    """``serve --model FILE.gguf``: a Q8_0 GGUF (written as llama.cpp lays it out, with the
    default model's tokenizer and template in its metadata) answers as transformers' own
    GGUF loader's model greedily continues the prompt its tokenizer renders."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hermes_async.model.gguf.writer import write_gguf

    monkeypatch.setenv("HERMES_HOME", str(tmp_path / "home"))
    path = make_tiny_model(tmp_path / "llama", "llama", head_dim=32, vocab_size=49152,
                           gguf_layout=True)
    gguf = write_gguf(path, tmp_path / "tiny.Q8_0.gguf", "Q8_0", tokenizer_dir=default_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=gguf.name)
    ids = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True,
                                        return_dict=False)
    oracle = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file=gguf.name,
                                                  dtype=torch.float32).eval()
    with torch.no_grad():
        ref = oracle.generate(torch.tensor([ids]), max_new_tokens=NEW_TOKENS, do_sample=False,
                              eos_token_id=None, pad_token_id=0)[0, len(ids):].tolist()
    config = real_config(gguf).replace(model={"dtype": "float32"})
    srv = ServerThread(config).start()
    try:
        client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="none", max_retries=0)
        assert [m.id for m in client.models.list().data] == ["tiny.Q8_0"]
        out = client.chat.completions.create(
            model="tiny.Q8_0", messages=MESSAGES, max_tokens=NEW_TOKENS, temperature=0,
            extra_body={"ignore_eos": True, "skip_special_tokens": False})
        assert out.usage.prompt_tokens == len(ids)
        assert out.choices[0].message.content == tokenizer.decode(ref)
    finally:
        srv.stop()
