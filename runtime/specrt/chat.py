"""Chat messages rendered by the model's own Jinja chat template, torch-free.

    template = ChatRenderer(text, {"bos_token": "<|endoftext|>", "eos_token": "<|im_end|>"})
    prompt = template.render(messages([{"role": "system", "content": "Be brief."},
                                       {"role": "user", "content": "hi"}]))

The template is the one the checkpoint's ``tokenizer_config.json`` carries (stored in the artifact
by the export, ``Manifest.chat_template``). It is rendered as transformers' ``apply_chat_template``
renders it: a sandboxed jinja2 environment with ``trim_blocks`` and ``lstrip_blocks``, the loop
controls extension, a ``tojson`` filter that keeps non-ASCII text, ``raise_exception`` and
``strftime_now``, and the tokenizer's special tokens by name. The ids are the rendered text
encoded without the tokenizer's own special tokens (the template writes them).

jinja2 is optional (the ``chat`` and ``serve`` extras): it is imported when a template is first
compiled, and a missing jinja2 is a :class:`~specrt.errors.MissingDependencyError` naming the extra.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from specrt.errors import InvalidRequestError, MissingDependencyError

ROLES = ("system", "user", "assistant", "tool")
MIN_JINJA = (3, 1, 6)  # earlier versions have known sandbox escapes; chat templates are untrusted code


@dataclass(frozen=True)
class Message:
    role: str  # one of ROLES
    content: str


def messages(raw: object, *, where: str = "messages") -> tuple[Message, ...]:
    """``raw`` (a list of ``{"role", "content"}`` mappings or Messages; content a string or a list
    of ``{"type": "text", "text"}`` parts) as Messages, or InvalidRequestError naming the first
    bad field as ``where[i].field``."""
    if isinstance(raw, (str, bytes)) or not isinstance(raw, Sequence) or not raw:
        raise InvalidRequestError(f"{where} must be a non-empty list of {{\"role\", \"content\"}} messages")
    out = []
    for i, m in enumerate(raw):
        if isinstance(m, Message):
            m = {"role": m.role, "content": m.content}
        if not isinstance(m, dict):
            raise InvalidRequestError(f"{where}[{i}] must be an object with role and content, got {type(m).__name__}")
        role = m.get("role")
        if role not in ROLES:
            raise InvalidRequestError(f"{where}[{i}].role must be one of {', '.join(ROLES)}, got {role!r}")
        out.append(Message(role, _content(m.get("content"), f"{where}[{i}].content")))
    return tuple(out)


def _content(content: object, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise InvalidRequestError(f"{where} parts must be {{\"type\": \"text\", \"text\": str}}, got {part!r}")
            parts.append(part["text"])
        return "".join(parts)
    raise InvalidRequestError(f"{where} must be a string or a list of text parts, got {type(content).__name__}")


def _jinja() -> Any:
    try:
        import jinja2
        import jinja2.ext
        import jinja2.sandbox
    except ImportError:
        raise MissingDependencyError(
            "rendering chat messages needs jinja2: pip install 'specrt[chat]' (or the 'serve' extra)"
        ) from None
    found = tuple(int(p) for p in jinja2.__version__.split(".")[:3] if p.isdigit())
    if found < MIN_JINJA:
        raise MissingDependencyError(
            f"rendering chat messages needs jinja2 >= {'.'.join(map(str, MIN_JINJA))} (earlier versions have "
            f"sandbox escapes), found {jinja2.__version__}: pip install 'specrt[chat]'"
        )
    return jinja2


class ChatRenderer:
    """One compiled chat template. Thread-safe: rendering keeps no state."""

    def __init__(self, template: str, special_tokens: dict[str, str], *, name: str = "chat template"):
        jinja2 = _jinja()
        self.name = name
        self.special_tokens = dict(special_tokens)
        self._errors = jinja2.TemplateError

        def raise_exception(message: str) -> None:
            raise jinja2.TemplateError(message)

        def tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
                   sort_keys: bool = False) -> str:
            return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

        env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                           extensions=[jinja2.ext.loopcontrols])
        env.filters["tojson"] = tojson
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        try:
            self._template = env.from_string(template)
        except jinja2.TemplateSyntaxError as e:
            raise InvalidRequestError(f"{name}: not a valid Jinja template (line {e.lineno}: {e.message})") from None

    def render(self, msgs: Sequence[Message], *, add_generation_prompt: bool = True) -> str:
        """The prompt text of ``msgs``, ending in the assistant's turn opening when
        ``add_generation_prompt``. A message the template refuses (its ``raise_exception``, e.g.
        roles that do not alternate) is an InvalidRequestError carrying the template's words."""
        plain = [{"role": m.role, "content": m.content} for m in msgs]
        try:
            return self._template.render(messages=plain, tools=None, documents=None,
                                         add_generation_prompt=add_generation_prompt, **self.special_tokens)
        except (self._errors, TypeError) as e:  # TypeError: e.g. the template adds a str and a None
            raise InvalidRequestError(f"{self.name} refused the messages: {e}") from None
