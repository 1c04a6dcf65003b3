"""Seeded JSON schemas for the structured-output tests: nested objects, arrays with bounds,
enums, integers and numbers with ranges, string patterns and lengths, anyOf, required and
optional fields. ``schemas(40)`` is the same list on every run."""

from __future__ import annotations

import random
from typing import Any

WORDS = ["red", "green", "blue", "cat", "dog", "north", "south", "small", "large", "open"]
PATTERNS = ["^[A-Z][a-z]{2,8}$", "^[0-9]{3}-[0-9]{4}$", "^[a-z]+(_[a-z]+)?$", "^v[0-9]\\.[0-9]$"]


def _leaf(rng: random.Random) -> dict[str, Any]:
    kind = rng.choice(["integer", "number", "string", "pattern", "enum", "boolean", "anyof"])
    if kind == "integer":
        lo = rng.randint(-50, 50)
        return {"type": "integer", "minimum": lo, "maximum": lo + rng.randint(0, 100)}
    if kind == "number":
        lo = rng.choice([-1.5, 0, 2.25, 10])
        return {"type": "number", "minimum": lo, "maximum": lo + rng.choice([1, 5.5, 100])}
    if kind == "string":
        lo = rng.randint(0, 3)
        return {"type": "string", "minLength": lo, "maxLength": lo + rng.randint(1, 12)}
    if kind == "pattern":
        return {"type": "string", "pattern": rng.choice(PATTERNS)}
    if kind == "enum":
        return {"enum": rng.sample(WORDS, rng.randint(2, 4))}
    if kind == "boolean":
        return {"type": "boolean"}
    return {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 9},
                      {"enum": rng.sample(WORDS, 2)}]}


def _array(rng: random.Random, depth: int) -> dict[str, Any]:
    lo = rng.randint(0, 2)
    items = _object(rng, depth + 1) if depth < 2 and rng.random() < 0.3 else _leaf(rng)
    return {"type": "array", "items": items, "minItems": lo, "maxItems": lo + rng.randint(1, 3)}


def _object(rng: random.Random, depth: int = 0) -> dict[str, Any]:
    props: dict[str, Any] = {}
    for i in range(rng.randint(1, 4 if depth == 0 else 2)):
        roll = rng.random()
        if depth < 2 and roll < 0.2:
            props[f"obj_{i}"] = _object(rng, depth + 1)
        elif roll < 0.4:
            props[f"list_{i}"] = _array(rng, depth)
        else:
            props[f"field_{i}"] = _leaf(rng)
    required = sorted(rng.sample(sorted(props), rng.randint(1, len(props))))
    return {"type": "object", "properties": props, "required": required,
            "additionalProperties": False}


def schemas(count: int, seed: int = 1234) -> list[dict[str, Any]]:
    """``count`` schemas, the same on every run."""
    rng = random.Random(seed)
    return [_object(rng) for _ in range(count)]
