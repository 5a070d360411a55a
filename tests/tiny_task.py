"""A tiny forkable task and a tiny random transformer, for trainer tests that must show learning.

The task (``TinyKeysEnv``): ``max_turns`` turns (2 by default, up to 4); a turn is correct
when its first word is the key for that turn ("A", "B", "C", "D" in order). Each correct turn
earns 1/max_turns; the observation after a turn says "ok" or "no". A random policy over the
11-token vocabulary scores about 0.09 per episode, and solves it (``em``) far more rarely.

The model: a 1-layer Llama with hidden size 32 over an 11-word vocabulary, randomly
initialised and saved as a local HF folder (config, safetensors, tokenizer.json), so the
trainers load it through the same path as any local model.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from treegym.envs.core import ForkableEnv, Plan, StepResult

VOCAB = ["[PAD]", "[EOS]", "A", "B", "C", "D", "E", "F", "ok", "no", "go"]
KEYS = ("A", "B", "C", "D")


@dataclass(frozen=True)
class KeysState:
    turn: int = 0
    correct: int = 0


class TinyKeysEnv(ForkableEnv[KeysState]):
    """Say "A", then "B" (then "C", "D"). Reward 1/max_turns per correct turn; ``em`` = all correct."""

    def __init__(self, max_turns: int = 2) -> None:
        super().__init__(max_obs_chars=16, max_action_chars=4096)
        self.max_turns = min(max_turns, len(KEYS))

    def _reset_state(self, options: dict[str, Any]) -> tuple[KeysState, str, dict[str, Any]]:
        return KeysState(), "go", {}

    def plan(self, action: str) -> Plan:
        return self.make_plan([], action)

    def resolve(self, plan: Plan, results: Sequence[Any]) -> StepResult:
        _die_if_asked()
        _pause_if_asked()
        self.check_plan(plan)
        action, s = plan.parsed, self.state
        words = str(action).split()
        hit = bool(words) and words[0] == KEYS[s.turn]
        s = replace(s, turn=s.turn + 1, correct=s.correct + int(hit))
        self.state = s
        done = s.turn >= self.max_turns
        info: dict[str, Any] = {"turn": s.turn, "invalid_action": not words, "tool_calls": 0}
        if done:
            info["success"] = info["em"] = float(s.correct == self.max_turns)
        return ("" if done else ("ok" if hit else "no")), hit / self.max_turns, done, False, info


def _die_if_asked() -> None:
    """For crash-recovery tests: SIGKILL this process in the middle of a training step, once its
    run has logged step N (``TINY_KILL_AFTER="<metrics.jsonl>:N"``). The config stays the same
    as the run that resumes it, so the kill lives in the process environment, not in env kwargs."""
    if _logged("TINY_KILL_AFTER"):
        os.kill(os.getpid(), signal.SIGKILL)


def _logged(var: str) -> bool:
    """Whether the run named by ``var`` (``"<metrics.jsonl>:N"``) has logged step N."""
    spec = os.environ.get(var)
    if not spec:
        return False
    path, step = spec.rsplit(":", 1)
    try:
        return f'"step": {int(step)},' in Path(path).read_text()
    except OSError:
        return False


def _pause_if_asked() -> None:
    """For concurrency tests: hang (a run still going) once the run has logged step N
    (``TINY_PAUSE_AFTER="<metrics.jsonl>:N"``), until the test kills the process."""
    if _logged("TINY_PAUSE_AFTER"):
        while True:
            time.sleep(1)


def build_tiny_model(folder: Path, seed: int = 0) -> Path:
    """Write a random tiny Llama + word-level tokenizer to ``folder`` (once); return it."""
    if (folder / "config.json").exists():
        return folder
    import torch
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tok = Tokenizer(WordLevel({w: i for i, w in enumerate(VOCAB)}, unk_token="[PAD]"))
    tok.pre_tokenizer = WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", eos_token="[EOS]")
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(VOCAB), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
        pad_token_id=0, eos_token_id=1, bos_token_id=None, tie_word_embeddings=True,
    )
    model = LlamaForCausalLM(config)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
