"""Model contexts built from an env's text, token by token, so that branches share prefixes.

A turn's context is always its parent's context + the action ids + the observation ids:

- the action ids are exactly the tokens the policy sampled (never decoded and re-encoded, so
  the trainer's log-probs and masks line up with what was generated);
- the observation ids are the env's text, plus whatever glue the format needs around it.

Two formats:

``raw`` (Search-R1): the opening prompt goes through the chat template as one user message
(when the tokenizer has one), then every action and observation is inlined as plain text.

``chat``: the prompt is a user message, actions are assistant turns, observations are user
turns. The template glue (``<|im_end|>\\n<|im_start|>user\\n`` ...) is read off the tokenizer's
own chat template once, so any template works, and lives in the observation ids (masked).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from treegym.errors import ConfigError

Mode = Literal["raw", "chat"]
MODES: tuple[str, ...] = ("raw", "chat")

# Sentinels must survive templating untouched and never occur in real text.
_A, _O, _U = "\x1eACTION\x1e", "\x1eOBSERVATION\x1e", "\x1eUSER\x1e"


@dataclass(frozen=True)
class ChatGlue:
    """The text a chat template puts around turns, split at the places observations go."""

    close_assistant: str  # ends an assistant turn, e.g. "<|im_end|>\n"
    open_user: str  # starts a user turn, e.g. "<|im_start|>user\n"
    close_user_open_assistant: str  # e.g. "<|im_end|>\n<|im_start|>assistant\n"


def chat_glue(tokenizer: Any, system: str | None = None) -> ChatGlue:
    """Read a tokenizer's chat-template glue by rendering sentinel messages."""
    head = [{"role": "system", "content": system}] if system else []
    msgs = [*head, {"role": "user", "content": _U}, {"role": "assistant", "content": _A}]
    closed = tokenizer.apply_chat_template(msgs, tokenize=False)
    full = tokenizer.apply_chat_template(
        [*msgs, {"role": "user", "content": _O}], tokenize=False, add_generation_prompt=True
    )
    if _A not in closed or _O not in full:
        raise ConfigError("the tokenizer's chat template drops message contents; use mode='raw'")
    close_assistant = closed.split(_A, 1)[1]
    between = full.split(_A, 1)[1].split(_O, 1)[0]
    if not between.startswith(close_assistant):
        # Templates that rewrite the whole history per turn cannot be extended token by token.
        raise ConfigError("the tokenizer's chat template is not prefix-stable; use mode='raw'")
    return ChatGlue(close_assistant, between[len(close_assistant) :], full.split(_O, 1)[1])


class TokenContext:
    """Turns an env's prompt and observations into token ids, in ``raw`` or ``chat`` mode.

    Args:
        tokenizer: a Hugging Face tokenizer (the policy's).
        mode: ``"raw"`` or ``"chat"`` (see the module docstring).
        system: an optional system message (chat template only).
        template_prompt: in raw mode, wrap the prompt in the chat template as Search-R1 does
            (ignored when the tokenizer has no template).
    """

    def __init__(self, tokenizer: Any, mode: Mode = "chat", system: str | None = None, template_prompt: bool = True) -> None:
        if mode not in MODES:
            raise ConfigError(f"context mode must be one of {MODES}, got {mode!r}")
        self.tokenizer = tokenizer
        self.mode = mode
        self.system = system
        has_template = bool(getattr(tokenizer, "chat_template", None))
        if mode == "chat" and not has_template:
            raise ConfigError("chat mode needs a tokenizer with a chat template; use mode='raw'")
        self.template_prompt = template_prompt and has_template
        self.glue = chat_glue(tokenizer, system) if mode == "chat" else None
        self._end_ids = {i for i in (getattr(tokenizer, "eos_token_id", None),) if i is not None}
        eos = getattr(tokenizer, "eos_token", None)
        self._eos_text = eos if isinstance(eos, str) else None

    def encode(self, text: str) -> list[int]:
        """Plain text to ids, with no BOS/EOS added (special-token text still maps to its id)."""
        return list(self.tokenizer.encode(text, add_special_tokens=False)) if text else []

    def prompt_ids(self, prompt: str) -> list[int]:
        """The opening context: the env's reset observation, ready for the first action."""
        if self.mode == "chat" or self.template_prompt:
            head = [{"role": "system", "content": self.system}] if self.system else []
            text = self.tokenizer.apply_chat_template(
                [*head, {"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
            )
            return self.encode(text)
        return list(self.tokenizer.encode(prompt, add_special_tokens=True))

    def observation_ids(self, observation: str, action_ids: Sequence[int], final: bool = False) -> list[int]:
        """Ids that follow a sampled action: the observation and, in chat mode, its glue.

        ``final`` (the episode ended with this turn) closes the assistant turn and adds the
        observation, if any, without opening a new assistant turn.
        """
        if self.glue is None:
            return self.encode(observation)
        close = self.glue.close_assistant
        # A model that ended its turn itself (EOS) already emitted the closing token.
        if action_ids and action_ids[-1] in self._end_ids and self._eos_text and close.startswith(self._eos_text):
            close = close[len(self._eos_text) :]
        if final:
            return self.encode(close + (self.glue.open_user + observation if observation else ""))
        return self.encode(close + self.glue.open_user + observation + self.glue.close_user_open_assistant)


def resolve_mode(mode: str, tokenizer: Any) -> Mode:
    """``auto`` -> ``chat`` when the tokenizer has a chat template, else ``raw``."""
    if mode == "auto":
        return "chat" if getattr(tokenizer, "chat_template", None) else "raw"
    return mode  # type: ignore[return-value]


def make_context(tokenizer: Any, mode: Mode | TokenContext = "chat") -> TokenContext:
    """A ``TokenContext`` for ``mode``, or ``mode`` itself if it already is one."""
    return mode if isinstance(mode, TokenContext) else TokenContext(tokenizer, mode)
