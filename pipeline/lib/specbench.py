"""Spec-Bench prompts (question.jsonl): 480 rows in 6 tasks; the 8 MT-bench categories form one task."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

MT_BENCH = frozenset({"writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities"})
TASKS = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")


@dataclass(frozen=True)
class Question:
    question_id: int
    task: str  # one of TASKS
    turns: tuple[str, ...]


def read_questions(path: Path) -> list[Question]:
    questions = []
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            try:
                row = json.loads(line)
                category = row["category"]
                task = "mt_bench" if category in MT_BENCH else category
                questions.append(Question(int(row["question_id"]), task, tuple(row["turns"])))
            except (json.JSONDecodeError, KeyError, TypeError) as e:
                raise ValueError(f"{path}:{line_no}: not a Spec-Bench row ({e})") from None
    return questions


def first_per_task(questions: list[Question], n: int) -> list[Question]:
    """The first ``n`` questions of every task, in task order."""
    return [q for task in TASKS for q in [q for q in questions if q.task == task][:n]]


def calibration_prompts(
    path: Path, encode: Callable[[str], np.ndarray], per_task: int, max_tokens: int
) -> list[np.ndarray]:
    """Token ids ([<= max_tokens] int64 each) of the first ``per_task`` first turns of every task,
    encoded by ``encode`` (which applies the model's chat template where it has one)."""
    return [encode(q.turns[0])[:max_tokens] for q in first_per_task(read_questions(path), per_task)]
