"""Turning chats and observations into token ids, in chat-template mode or raw mode.

Raw mode (Search-R1 style) tokenises the text as is: the prompt, then each action and each
``<information>`` block inlined. Chat-template mode renders the tokenizer's chat template:
the prompt is the first user message with the assistant header opened, and each observation
closes the assistant turn, adds a user turn, and opens the next assistant turn.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from treegym.errors import ConfigError

Message = dict[str, str]


def _ids(encoded: Any) -> list[int]:
    # apply_chat_template returns a list in transformers 4.x and a BatchEncoding in 5.x.
    if hasattr(encoded, "keys") and "input_ids" in encoded:
        encoded = encoded["input_ids"]
    return [int(t) for t in encoded]


def chat_prompt_ids(
    tokenizer: Any,
    messages: Sequence[Message],
    add_generation_prompt: bool = True,
    tools: list[dict[str, Any]] | None = None,
) -> list[int]:
    """The chat template over ``messages`` (and the OpenAI ``tools``, for a template that lists
    them), ending with an open assistant turn."""
    if not getattr(tokenizer, "chat_template", None):
        raise ConfigError("this tokenizer has no chat template; use raw mode (text_ids) instead")
    encoded = tokenizer.apply_chat_template(
        list(messages), tools=tools, add_generation_prompt=add_generation_prompt, tokenize=True
    )
    return _ids(encoded)


def text_ids(tokenizer: Any, text: str) -> list[int]:
    """Raw-mode tokens of ``text``, without special tokens added."""
    return [int(t) for t in tokenizer(text, add_special_tokens=False)["input_ids"]]


def chat_observation_ids(tokenizer: Any, observation: str, assistant_closed: bool) -> list[int]:
    """Chat-mode tokens to append after an assistant turn: [end of turn] + user(observation) +
    the next assistant header.

    ``assistant_closed`` says whether the sampled turn already ends with the end-of-turn token
    (it stopped on EOS); a turn cut at a stop string such as ``</search>`` did not.
    """
    # Render a dummy exchange with and without the observation and keep the difference, so
    # the template's exact separators are used whatever they are.
    marker = "\x00treegym-turn\x00"
    base = [{"role": "user", "content": "q"}, {"role": "assistant", "content": marker}]
    before = tokenizer.apply_chat_template(base, tokenize=False)
    after = tokenizer.apply_chat_template(
        base + [{"role": "user", "content": observation}], tokenize=False, add_generation_prompt=True
    )
    cut = after.index(marker) + len(marker)
    delta = after[cut:]
    if assistant_closed:
        closing = before[before.index(marker) + len(marker) :]
        eos = tokenizer.eos_token or ""
        # Drop the end-of-turn token the model already produced (it is in its token ids).
        if eos and delta.startswith(eos):
            delta = delta[len(eos) :]
        elif closing and delta.startswith(closing):
            delta = delta[len(closing) :]
    return text_ids(tokenizer, delta)
