"""What every test lane shares, torch-free (the runtime lane, tests/runtime, imports only this,
numpy, tokenizers and specrt): the tiny models' texts and tokenizer, the tiny artifacts committed
under tests/data/tiny, Spec-Bench-shaped question files, chat-template edits of an artifact, and the
chi-square test the sampling-law tests use. The torch-side builders are in tests/tiny.py.
"""

from __future__ import annotations

import json
import math
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from specrt.files import file_entry

ARCHS = ("qwen2", "llama", "gemma3")
VOCAB = 320
EOS = "<eos>"
GEMMA_WINDOW = 8

TRAINING_TEXT = [
    "def add(a, b):\n    return a + b\n",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "The quick brown fox jumps over the lazy dog. The dog sleeps.",
    "Summarize the following text. Speculative decoding drafts tokens and verifies them in one pass.",
    "for i in range(10):\n    print(i, i * i)\n",
]

PROMPTS = [
    "def add(a, b):\n    return a + b\n\ndef add(",
    "The quick brown fox jumps over the lazy dog. The quick brown",
    "for i in range(10):\n    print(i)\nfor i in range(10):\n",
    "Summarize: speculative decoding drafts tokens. Summary: speculative",
    "x",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n\nprint(fib(",
]


COMMITTED = Path(__file__).parent / "data" / "tiny"  # `python -m tests.tiny tests/data/tiny` writes them
COMMITTED_CHAT = "qwen2-chat"  # the Qwen2 one exported with Qwen2.5's chat template (tests/data)
QWEN25_CHAT_TEMPLATE = Path(__file__).parent / "data" / "qwen2.5-chat-template.jinja"  # the default model's


def committed_artifact(name: str, dst: Path) -> Path:
    """A copy at ``dst`` of the committed tiny artifact ``name`` (an arch of ARCHS or COMMITTED_CHAT),
    so that no test can change the repository's own."""
    src = COMMITTED / name
    if not (src / "manifest.json").is_file():
        raise FileNotFoundError(f"{src}: no committed tiny artifact (`python -m tests.tiny {COMMITTED}` writes them)")
    return Path(shutil.copytree(src, dst))


def ctx(*tokens: int) -> np.ndarray:
    """A token context ([t] int64) for a drafter, from literal ids."""
    return np.array(tokens, np.int64)


def as_lists(tree) -> tuple[list[int], list[int]]:
    """(token ids, parents) of a draft tree (specrt.tree.DraftTree, specrt.drafters.indexes.suffix_tree.Draft)
    as lists."""
    return tree.token_ids.tolist(), tree.parents.tolist()


def tiny_tokenizer(path: Path) -> Path:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(TRAINING_TEXT, trainer=trainer)
    tok.save(str(path))
    return path


def specbench_questions(path: Path) -> Path:
    """A Spec-Bench question.jsonl at ``path``: one row per task (MT-bench as "writing"), turns from PROMPTS."""
    tasks = ["writing", "translation", "summarization", "qa", "math_reasoning", "rag"]
    rows = [{"question_id": i, "category": task, "turns": [PROMPTS[i % len(PROMPTS)]]} for i, task in enumerate(tasks)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def with_chat(src: Path, dst: Path, template: str | None, chat: dict | None = None) -> Path:
    """A copy of the artifact ``src`` at ``dst`` whose chat template file is ``template`` (None: the
    manifest stores none, as artifacts exported before templates were kept) and, when given,
    whose single-user-turn ``chat`` prefix/suffix is ``chat``; the manifest's file table follows."""
    shutil.copytree(src, dst)
    manifest = json.loads((dst / "manifest.json").read_text())
    if template is None:
        (dst / manifest["chat_template"]["file"]).unlink()
        del manifest["files"][manifest["chat_template"]["file"]]
        manifest["chat_template"] = None
    else:
        (dst / manifest["chat_template"]["file"]).write_text(template)
        entry = file_entry(dst / manifest["chat_template"]["file"])
        manifest["files"][manifest["chat_template"]["file"]] = {"sha256": entry.sha256, "bytes": entry.bytes}
    if chat is not None:
        manifest["chat"] = chat
    (dst / "manifest.json").write_text(json.dumps(manifest))
    return dst


def chi2_sf(x: float, df: int) -> float:
    """P(X >= x) for X ~ chi-square(df), df a positive integer, in closed form (no scipy)."""
    h = x / 2.0
    if df % 2 == 0:  # e^{-h} sum_{i < df/2} h^i / i!
        return math.exp(-h) * sum(h**i / math.factorial(i) for i in range(df // 2))
    # erfc(sqrt(h)) + e^{-h} sum_{i=1}^{(df-1)/2} h^(i - 1/2) / Gamma(i + 1/2)
    return math.erfc(math.sqrt(h)) + math.exp(-h) * sum(
        h ** (i - 0.5) / math.gamma(i + 0.5) for i in range(1, (df + 1) // 2)
    )


def chi2_pvalue(counts: Counter, law: dict[tuple[int, ...], float]) -> float:
    """Pearson chi-square p-value of ``counts`` against ``law``; an impossible outcome gives 0."""
    total = sum(counts.values())
    if any(law.get(key, 0.0) == 0.0 for key in counts):
        return 0.0
    keys = [key for key, prob in law.items() if prob > 0]
    expected = total * np.array([law[key] for key in keys])
    observed = np.array([counts[key] for key in keys], np.float64)
    small = expected < 5
    if small.any():  # pool the rare cells into one
        expected = np.append(expected[~small], expected[small].sum())
        observed = np.append(observed[~small], observed[small].sum())
    stat = float(((observed - expected) ** 2 / expected).sum())
    return chi2_sf(stat, len(expected) - 1)
