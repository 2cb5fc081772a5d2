"""The model's chat template, as the export stage stores it and the peers stage applies it.

Two forms: the single-user-turn template split around the prompt (the manifest's ``chat``, which
``model.encode(text, chat=True)`` wraps a prompt in), and the tokenizer's Jinja template written to
``chat_template.jinja`` for ``specrt.chat``. The peers stage splits a checkpoint's template the same
way, so its prompt ids equal specrt's.
"""

from __future__ import annotations

from pathlib import Path

from transformers import PreTrainedTokenizerBase

from specrt.backend.manifest import ChatTemplate, ChatTemplateFile

CHAT_TEMPLATE_FILE = "chat_template.jinja"  # the model's Jinja chat template, rendered by specrt.chat
_CHAT_SLOT = "\u2063PROMPT\u2063"  # an invisible separator that no template contains


def chat_template(tokenizer: PreTrainedTokenizerBase) -> ChatTemplate | None:
    """The model's single-user-turn template split around the prompt, or None if it has none."""
    if not getattr(tokenizer, "chat_template", None):
        return None
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": _CHAT_SLOT}], tokenize=False, add_generation_prompt=True
    )
    prefix, found, suffix = text.partition(_CHAT_SLOT)
    if not found:
        raise ValueError("the chat template dropped the user message; cannot split it around the prompt")
    return ChatTemplate(prefix=prefix, suffix=suffix)


def write_chat_template(tokenizer: PreTrainedTokenizerBase, out: Path) -> ChatTemplateFile | None:
    """The tokenizer's Jinja chat template (from the checkpoint's tokenizer_config.json, which the
    weights stage took from the GGUF) written to ``out/chat_template.jinja``, with the special tokens
    it may read by name (as ``apply_chat_template`` passes them); None when it has no template."""
    template = getattr(tokenizer, "chat_template", None)
    if not template:
        return None
    if not isinstance(template, str):
        raise ValueError(f"the tokenizer's chat_template is a {type(template).__name__}, expected one template (str)")
    (out / CHAT_TEMPLATE_FILE).write_text(template, encoding="utf-8")
    special = {k: v for k, v in tokenizer.special_tokens_map.items() if isinstance(v, str)}
    return ChatTemplateFile(file=CHAT_TEMPLATE_FILE, special_tokens=special)
