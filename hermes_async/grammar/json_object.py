"""OpenAI's ``json_object`` as a bounded Lark grammar: any JSON object, within limits a real
answer never meets, so that a small model looping on keys or nesting still has to close its
document before ``max_tokens`` (greedy decoding of a 135M model repeats a key forever
otherwise).

Limits: objects and arrays hold at most :data:`MAX_MEMBERS` members, nest at most
:data:`MAX_DEPTH` levels, strings hold at most :data:`MAX_STRING` characters; numbers as in
:mod:`.json_bounds` (15 integer digits, 6 decimals, 3 exponent digits); whitespace between
tokens is one optional newline and some indentation. Everything it allows is valid JSON.
"""

from __future__ import annotations

MAX_DEPTH = 4
MAX_MEMBERS = 16
MAX_STRING = 256

_TERMINALS = r'''
SCALAR: STR | NUM | "true" | "false" | "null"
STR: /"([^"\\\x00-\x1f]|\\["\\\/bfnrt]|\\u[0-9a-fA-F]{4}){0,%d}"/
NUM: /-?(0|[1-9][0-9]{0,14})(\.[0-9]{1,6})?([eE][+-]?[0-9]{1,3})?/
WS: /\n?[ \t]{0,24}/
'''


def json_object_lark(depth: int = MAX_DEPTH, members: int = MAX_MEMBERS,
                     string_chars: int = MAX_STRING) -> str:
    """The Lark text (llguidance's dialect) of a JSON object within the given limits."""
    more = members - 1
    rules = [f"start: obj{depth}"]
    for d in range(depth, 0, -1):
        value = "SCALAR" if d == 1 else f"obj{d - 1} | arr{d - 1} | SCALAR"
        rules += [
            f'obj{d}: "{{" WS (pair{d} ("," WS pair{d}){{0,{more}}})? WS "}}"',
            f'pair{d}: STR WS ":" WS val{d}',
            f'arr{d}: "[" WS (val{d} ("," WS val{d}){{0,{more}}})? WS "]"',
            f"val{d}: {value}",
        ]
    return "\n".join(rules) + _TERMINALS % string_chars
