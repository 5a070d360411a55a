"""An action-ranking agent: scores each listed command by its log-likelihood under a causal LM
and plays the best one, as agents that choose from ALFWorld's admissible actions do.

It is a text agent (``act(messages) -> str``) like any third-party one: ``treegym eval --agent
rank:smollm2`` (or ``rank:MODEL_FOLDER``) on an env whose observations list their commands
(``TextHousehold-Train-v0``, or ``TextHousehold-v0`` with ``list_admissible=True``). It never
generates, so it never writes an inadmissible command; what it measures is whether the model
prefers the right command once the choices are in front of it.

The context is the last observation alone (the task, the feedback and the list, as verl-agent's
prompt with no history), in the model's chat template, so a turn costs one forward pass of about
150 tokens; the candidates then share its KV cache. A command's score is its mean log-probability
per token (the sum would favour short commands).
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from treegym.envs.household.listing import split_observation


class ActionRanker:
    """Plays the listed command the model finds most likely (see the module docstring)."""

    def __init__(self, model: Any = "smollm2", tokenizer: Any = None) -> None:
        if isinstance(model, str):
            from treegym.agents.models import load_model

            model, tokenizer = load_model(model, device="cpu", dtype=torch.float32)
        self.model, self.tokenizer = model.eval(), tokenizer
        # transformers 5.x names the argument `cache` (`past_key_values` is a deprecated alias).
        self._cache_arg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"

    def scores(self, observation: str, commands: list[str]) -> list[float]:
        """Mean log-probability per token of each command as the reply to ``observation``."""
        tok = self.tokenizer
        prefix = tok.apply_chat_template([{"role": "user", "content": observation}], tokenize=False,
                                         add_generation_prompt=True)
        p_ids = tok.encode(prefix, add_special_tokens=False)
        c_ids = [tok.encode(c, add_special_tokens=False) for c in commands]
        with torch.no_grad():
            # the head only where it is read: the last position predicts each command's first token
            out = self.model(input_ids=torch.tensor([p_ids]), use_cache=True, logits_to_keep=1)
            first = torch.log_softmax(out.logits[0, -1].float(), -1)  # each command's first token
            width = max(len(c) for c in c_ids)
            pad = tok.pad_token_id if tok.pad_token_id is not None else 0
            ids = torch.tensor([c + [pad] * (width - len(c)) for c in c_ids])
            attn = torch.tensor([[1] * len(p_ids) + [1] * len(c) + [0] * (width - len(c)) for c in c_ids])
            # transformers 5.x returns the cache as `cache` (reading `past_key_values` warns)
            cache = getattr(out, "cache", None)
            cache = out.past_key_values if cache is None else cache
            cache.batch_repeat_interleave(len(commands))
            logits = self.model(input_ids=ids, attention_mask=attn, use_cache=False, **{self._cache_arg: cache}).logits
            logp = torch.log_softmax(logits.float(), -1)
        result = []
        for row, c in enumerate(c_ids):
            total = float(first[c[0]]) + sum(float(logp[row, k - 1, c[k]]) for k in range(1, len(c)))
            result.append(total / len(c))
        return result

    def act(self, messages: list[dict[str, str]]) -> str:
        observation = messages[-1].get("content", "") if messages else ""
        listed = split_observation(observation)[1]
        if not listed:
            return "look"  # an env that lists nothing: nothing to rank
        scores = self.scores(observation, listed)
        return listed[max(range(len(listed)), key=scores.__getitem__)]
