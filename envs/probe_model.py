"""Tiny models for the probe environments, built from scratch and given a format prior.

A probe's model is a small random Llama over the probes' word vocabulary, saved as a local HF
folder (config, safetensors, tokenizer.json), so that every trainer loads it through the
same path as any local model. Before it is saved it learns the *format* of its probe and
nothing else: a few hundred supervised steps on episodes whose moves are drawn uniformly
from the legal ones, with free words after them. It then starts RL the way an instruct LLM
starts agent RL: it writes well-formed turns of the right length, but knows no answer, so
a terminal reward is as rare as choices^-horizon.

With ``prior="uses_tools"`` the prior's episodes that call the Lookup tool answer with its
result: the model knows what a tool's result is for, as an instruct LLM does, and calls it only
at the format's rate (1 in ``choices + 1`` first turns), so RL has to learn *when* to call. With
the default ``"uniform"`` prior it must also learn to use the result (the chicken-and-egg).
``prior="random"`` skips the prior: the random-init model knows neither format nor moves.

Models are cached under ``TREEGYM_HOME/probe-models``, keyed by every input, so a grid of
runs builds each one once.
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path
from typing import Any

from treegym.envs.probes import FILLER, LOOK, SYMBOLS, ProbeEnv
from treegym.paths import cache_dir, sealed_folder

MODEL_VERSION = 2
PRIOR_STEPS = 300
PRIOR_EPISODES = 64  # per batch
PRIORS = ("uniform", "uses_tools", "random")


def probe_model_folder(env: ProbeEnv, turn_tokens: int, seed: int = 0, prior: str = "uniform") -> Path:
    """Where the model for ``env`` at ``turn_tokens`` tokens per turn is (or will be) cached."""
    key = {"env": type(env).__name__, "horizon": env.horizon, "choices": env.choices, "key_seed": env.key_seed,
           "turn_tokens": turn_tokens, "seed": seed, "version": MODEL_VERSION}  # fmt: skip
    if hasattr(env, "doors"):
        key["doors"] = env.doors
    if env.shape():
        key["shape"] = env.shape()
    if prior != "uniform":
        key["prior"] = prior
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    return cache_dir("probe-models") / f"{type(env).__name__}-h{env.horizon}-c{env.choices}-L{turn_tokens}-{digest}"


def build_probe_model(env: ProbeEnv, turn_tokens: int, seed: int = 0, folder: Path | None = None,
                      steps: int = PRIOR_STEPS, prior: str = "uniform") -> Path:
    """Build (once) the tiny model for ``env``'s format; return its HF folder.

    ``steps`` of the format prior; the cached default folder always uses ``PRIOR_STEPS``.
    ``prior``: ``"uniform"``, ``"uses_tools"`` (see the module doc) or ``"random"`` (no prior:
    the random-init model, which knows neither the format nor the moves).
    """
    if prior not in PRIORS:
        raise ValueError(f"prior must be one of {PRIORS}, got {prior!r}")
    if folder is None and steps != PRIOR_STEPS:
        raise ValueError("a model with a non-default number of prior steps needs its own folder")
    # Sealed, and written aside and renamed (``sealed_folder``): parallel study workers never read
    # half a model, and a cut or garbled one is built again, never trained from.
    return sealed_folder(folder or probe_model_folder(env, turn_tokens, seed, prior),
                         lambda out: _build(env, turn_tokens, seed, steps, prior, out), "probe model")


def _build(env: ProbeEnv, turn_tokens: int, seed: int, steps: int, prior: str, out: Path) -> None:
    import torch
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    vocab = env.vocab
    tok = Tokenizer(WordLevel({w: i for i, w in enumerate(vocab)}, unk_token="[PAD]"))
    tok.pre_tokenizer = WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", eos_token="[EOS]")
    torch.manual_seed(seed)
    longest = 1 + env.horizon * (turn_tokens + env.obs_words)
    config = LlamaConfig(
        vocab_size=len(vocab), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=max(64, 2 * longest),
        pad_token_id=0, eos_token_id=1, bos_token_id=None, tie_word_embeddings=True,
    )  # fmt: skip
    model = LlamaForCausalLM(config)
    if prior != "random":
        _learn_format(model, tokenizer, env, turn_tokens, random.Random(seed), steps, prior)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def random_episode(env: ProbeEnv, turn_tokens: int, rng: random.Random,
                   prior: str = "uniform") -> tuple[list[str], list[int]]:
    """Words of one episode with uniformly random legal moves, and 1 on each action word; under
    ``prior="uses_tools"`` the move after a look uses its result where the env says so
    (``prior_answer``). A turn opens with the env's ``opening`` word, when it has one."""
    head_words = 1 + (env.opening is not None)
    if turn_tokens < head_words:
        raise ValueError(f"a turn of {turn_tokens} token(s) cannot hold the opening word and the move")
    seed = rng.randrange(2**31)
    obs, _ = env.reset(seed=seed)
    words, mask = obs.split(), [0] * len(obs.split())
    free = [*SYMBOLS, LOOK, *FILLER]
    done, looked = False, None
    while not done:
        legal = env.legal_moves(env.state)
        move = rng.choice(legal)
        if prior == "uses_tools":
            move = env.prior_answer(env.state, looked) or move
        head = [move] if env.opening is None else [env.opening, move]
        action = head + [rng.choice(free) for _ in range(turn_tokens - head_words)]
        obs, _, terminated, truncated, _ = env.step(" ".join(action))
        done = terminated or truncated
        looked = obs if move == LOOK else looked
        words += action + obs.split()
        mask += [1] * len(action) + [0] * len(obs.split())
    return words, mask


def _learn_format(model: Any, tokenizer: Any, env: ProbeEnv, turn_tokens: int, rng: random.Random, steps: int,
                  prior: str = "uniform") -> None:
    """Cross-entropy on the action words of random legal episodes (the format, not the answers)."""
    import torch

    env = env.fork()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(steps):
        episodes = [random_episode(env, turn_tokens, rng, prior) for _ in range(PRIOR_EPISODES)]
        width = max(len(w) for w, _ in episodes)  # episodes that end early are right-padded, unmasked
        ids = torch.tensor([tokenizer.convert_tokens_to_ids(w) + [0] * (width - len(w)) for w, _ in episodes])
        mask = torch.tensor([m + [0] * (width - len(m)) for _, m in episodes], dtype=torch.bool)
        logits = model(input_ids=ids).logits[:, :-1]
        target = ids[:, 1:].masked_fill(~mask[:, 1:], -100)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
