"""Chat templates in the shapes of the families hermes serves, each over a tiny tokenizer
trained here with that family's control tokens (written for these tests in the published
templates' shapes; the oracle is ``apply_chat_template`` over the same template):

- ``gemma``: ``<start_of_turn>user``/``model``, the system prompt folded into the first user
  turn, contents trimmed (Gemma 2/3);
- ``phi``: ``<|system|>``, ``<|user|>``, ``<|assistant|>`` each closed by ``<|end|>`` (which
  strips the whitespace after it), a SentencePiece-style vocabulary (Phi-3/Phi-4-mini);
- ``granite``: ``<|start_of_role|>ROLE<|end_of_role|>`` ... ``<|end_of_text|>``, tools as an
  ``available_tools`` turn, tool results as ``tool_response``, calls after ``<|tool_call|>``
  (Granite 3.x);
- ``hermes``: ChatML with tools in ``<tools></tools>`` inside the system turn, calls in
  ``<tool_call>`` and results in ``<tool_response>`` inside a user turn (Hermes 2-4, Qwen2.5/3).
"""

from __future__ import annotations

from typing import Any

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

from tests.prompt.conftest import CORPUS, _wrap

GEMMA_TEMPLATE = (
    "{{ bos_token }}"
    "{%- if messages[0]['role'] == 'system' -%}"
    "{%- set first_prefix = (messages[0]['content'] or '') + '\n\n' -%}"
    "{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}{%- set first_prefix = '' -%}{%- set loop_messages = messages -%}{%- endif -%}"
    "{%- for m in loop_messages -%}"
    "{%- set role = 'model' if m['role'] == 'assistant' else m['role'] -%}"
    "{{ '<start_of_turn>' + role + '\n' + (first_prefix if loop.first else '') }}"
    "{{ (m['content'] or '') | trim }}{{ '<end_of_turn>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}"
)

PHI_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m['role'] == 'system' and m['content'] %}"
    "{{ '<|system|>\n' + m['content'] + '<|end|>\n' }}"
    "{% elif m['role'] == 'user' %}{{ '<|user|>\n' + m['content'] + '<|end|>\n' }}"
    "{% elif m['role'] == 'assistant' %}"
    "{{ '<|assistant|>\n' + (m['content'] or '') + '<|end|>\n' }}"
    "{% elif m['role'] != 'system' %}{{ '<|' + m['role'] + '|>\n' + m['content'] + '<|end|>\n' }}"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}"
)

GRANITE_TEMPLATE = (
    "{%- if tools -%}{{ '<|start_of_role|>available_tools<|end_of_role|>\n' }}"
    "{%- for t in tools -%}{{ t | tojson(indent=4) }}{% if not loop.last %}{{ '\n\n' }}"
    "{% endif %}{%- endfor -%}{{ '<|end_of_text|>\n' }}{%- endif -%}"
    "{%- for m in messages -%}"
    "{%- if m['role'] == 'tool' -%}"
    "{{ '<|start_of_role|>tool_response<|end_of_role|>' + m['content'] + '<|end_of_text|>\n' }}"
    "{%- elif m['tool_calls'] is defined -%}"
    "{{ '<|start_of_role|>assistant<|end_of_role|><|tool_call|>' }}"
    "{{ m['tool_calls'] | map(attribute='function') | list | tojson }}{{ '<|end_of_text|>\n' }}"
    "{%- else -%}"
    "{{ '<|start_of_role|>' + m['role'] + '<|end_of_role|>' + (m['content'] or '') }}"
    "{{ '<|end_of_text|>\n' }}"
    "{%- endif -%}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|start_of_role|>assistant<|end_of_role|>' }}"
    "{%- endif -%}"
)

HERMES_TEMPLATE = (
    "{%- if tools -%}{{ '<|im_start|>system\n' }}"
    "{%- if messages[0]['role'] == 'system' -%}{{ messages[0]['content'] + '\n\n' }}{%- endif -%}"
    "{{ '# Tools\n\nYou may call one or more functions to assist with the user query.\n\n'"
    " + 'You are provided with function signatures within <tools></tools> XML tags:\n<tools>' }}"
    "{%- for t in tools -%}{{ '\n' + (t | tojson) }}{%- endfor -%}"
    "{{ '\n</tools>\n\nFor each function call, return a json object with function name and '"
    " + 'arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n'"
    " + '{\"name\": <function-name>, \"arguments\": <args-json-object>}\n'"
    " + '</tool_call><|im_end|>\n' }}"
    "{%- elif messages[0]['role'] == 'system' -%}"
    "{{ '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}"
    "{%- endif -%}"
    "{%- for m in messages -%}"
    "{%- if m['role'] == 'system' and loop.first -%}"
    "{%- elif m['role'] == 'tool' -%}"
    "{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' -%}"
    "{{ '<|im_start|>user' }}{%- endif -%}"
    "{{ '\n<tool_response>\n' + m['content'] + '\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' -%}{{ '<|im_end|>\n' }}"
    "{%- endif -%}"
    "{%- elif m['role'] == 'assistant' -%}{{ '<|im_start|>assistant\n' + (m['content'] or '') }}"
    "{%- for tc in m['tool_calls'] or [] -%}"
    "{{ '\n<tool_call>\n{\"name\": \"' + tc['function']['name'] + '\", \"arguments\": ' }}"
    "{{ tc['function']['arguments'] | tojson }}{{ '}\n</tool_call>' }}"
    "{%- endfor -%}{{ '<|im_end|>\n' }}"
    "{%- else -%}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}"
    "{%- endif -%}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\n' }}{%- endif -%}"
)


def _byte_level(specials: list[str], added: list[str] = ()) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=500, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    if added:
        tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in added])
    return tok


def build_gemma_tokenizer() -> Any:
    specials = ["<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>"]
    return _wrap(_byte_level(specials), GEMMA_TEMPLATE, bos_token="<bos>",
                 eos_token="<end_of_turn>", pad_token="<pad>",
                 additional_special_tokens=specials[3:])


def build_phi_tokenizer() -> Any:
    """Metaspace pre-tokenizer (a SentencePiece-style vocabulary, as Phi-3's)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first",
                                                 split=False)
    specials = ["<unk>", "<s>", "<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>",
                "<|tool|>", "<|end|>"]
    trainer = trainers.BpeTrainer(vocab_size=500, special_tokens=specials, show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    tok.add_special_tokens([AddedToken("<|end|>", special=True, normalized=False, rstrip=True)])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    return _wrap(tok, PHI_TEMPLATE, bos_token="<s>", eos_token="<|endoftext|>",
                 unk_token="<unk>", additional_special_tokens=specials[3:])


def build_granite_tokenizer() -> Any:
    specials = ["<|end_of_text|>", "<|start_of_role|>", "<|end_of_role|>", "<|tool_call|>"]
    return _wrap(_byte_level(specials), GRANITE_TEMPLATE, bos_token="<|end_of_text|>",
                 eos_token="<|end_of_text|>", additional_special_tokens=specials[1:])


def build_hermes_tokenizer() -> Any:
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = _byte_level(specials, ["<tool_call>", "</tool_call>", "<tool_response>",
                                 "</tool_response>"])
    return _wrap(tok, HERMES_TEMPLATE, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                 additional_special_tokens=specials[1:])


BUILDERS = {"gemma": build_gemma_tokenizer, "phi": build_phi_tokenizer,
            "granite": build_granite_tokenizer, "hermes": build_hermes_tokenizer}
TOOL_TEMPLATES = ("llama", "granite", "hermes")  # the test templates that render tools
