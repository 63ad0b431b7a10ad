"""Deterministic tiny text corpora: chat (sharegpt + openai), alpaca-style instruct, C4-like docs, captions.

Every row comes from a seeded ``random.Random``, so the same code writes the same bytes. The rows are
templated and repetitive on purpose: a tiny model's loss visibly drops within a few dozen steps.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel")
COLORS = ("red", "green", "blue", "yellow", "purple", "orange")
SHAPES = ("circle", "square", "triangle", "star")
SYSTEM_PROMPT = "You are a tiny test assistant."
N_ROWS = 64
N_C4_TRAIN, N_C4_VALIDATION = 320, 32
N_CAPTIONS = 32


def _qa(rng: random.Random) -> tuple[str, str, int, int, str]:
    a, b, w = rng.randint(0, 50), rng.randint(0, 50), rng.choice(WORDS)
    question = f"What is {a} plus {b}? Also spell {w}."
    answer = f"{a} plus {b} is {a + b}. {w} is spelled {' '.join(w)}."
    return question, answer, a, b, w


def chat_rows(n: int = N_ROWS, seed: int = 0) -> list[tuple[str, str]]:
    """(question, answer) pairs shared by both chat styles."""
    rng = random.Random(seed)
    return [_qa(rng)[:2] for _ in range(n)]


def sharegpt_records(pairs: list[tuple[str, str]]) -> list[dict]:
    """``{"conversations": [{"from", "value"}...]}`` rows (torchtune ``conversation_style: sharegpt``)."""
    return [
        {
            "conversations": [
                {"from": "system", "value": SYSTEM_PROMPT},
                {"from": "human", "value": q},
                {"from": "gpt", "value": a},
            ]
        }
        for q, a in pairs
    ]


def openai_records(pairs: list[tuple[str, str]]) -> list[dict]:
    """``{"messages": [{"role", "content"}...]}`` rows (torchtune ``conversation_style: openai``)."""
    return [
        {
            "messages": [
                {"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": q},
                {"role": "assistant", "content": a},
            ]
        }
        for q, a in pairs
    ]


def alpaca_records(n: int = N_ROWS, seed: int = 1) -> list[dict]:
    """``instruction``/``input``/``output`` rows (torchtune ``alpaca_dataset``)."""
    rng = random.Random(seed)
    draws = [_qa(rng)[2:] for _ in range(n)]
    return [
        {
            "instruction": f"Add {a} and {b}.",
            "input": f"The word is {w}." if i % 2 else "",
            "output": f"The sum is {a + b}. The word was {w}.",
        }
        for i, (a, b, w) in enumerate(draws)
    ]


def c4_texts(n: int, seed: int) -> list[str]:
    """C4-like documents: a few templated sentences each."""
    rng = random.Random(seed)

    def sentence() -> str:
        c, s, w = rng.choice(COLORS), rng.choice(SHAPES), rng.choice(WORDS)
        return f"The {c} {s} number {rng.randint(1, 9)} belongs to {w}."

    return [" ".join(sentence() for _ in range(rng.randint(2, 5))) for _ in range(n)]


def captions(n: int = N_CAPTIONS, seed: int = 2) -> list[tuple[str, str, str]]:
    """(caption, color, shape) triples for the cc12m-like image set."""
    rng = random.Random(seed)
    pairs = [(rng.choice(COLORS), rng.choice(SHAPES)) for _ in range(n)]
    return [(f"a {c} {s} on a white background", c, s) for c, s in pairs]


def caption_vocabulary() -> list[str]:
    """Every word a caption can contain, sorted (for the tiny T5 / CLIP vocabularies)."""
    return sorted({"a", "on", "white", "background", *COLORS, *SHAPES})


def write_json(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rows, indent=1) + "\n")


def write_c4(folder: Path) -> None:
    """A folder torchtitan's ``c4`` and ``c4_validation`` datasets read with ``dataset_path=folder``."""
    from cookbook.data.titan import write_c4 as write_c4_layout

    docs = c4_texts(N_C4_TRAIN, seed=3) + c4_texts(N_C4_VALIDATION, seed=4)
    write_c4_layout(docs, folder, shard_rows=N_C4_TRAIN, validation_rows=N_C4_VALIDATION)


def training_text() -> str:
    """The text the tiny BPE is trained on."""
    pairs = chat_rows()
    records = (sharegpt_records(pairs), openai_records(pairs), alpaca_records())
    return "\n".join([*map(json.dumps, records), *c4_texts(N_C4_TRAIN, seed=3)])
