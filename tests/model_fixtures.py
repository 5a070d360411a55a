"""Model fixtures shared by the policy, server and training tests: built or loaded once per session."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def smollm2():
    """(model, tokenizer) of the embedded SmolLM2-135M-Instruct, on CPU, fp32."""
    import torch

    from treegym.agents.models import load_model

    torch.manual_seed(0)
    return load_model("smollm2", device="cpu")


@pytest.fixture(scope="session")
def tiny_chat_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 1-layer random Llama over SmolLM2's real tokenizer and chat template: it reads and
    writes the envs' English text, and a training step takes well under a second."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from treegym.agents.models import smollm2_folder

    tokenizer = AutoTokenizer.from_pretrained(smollm2_folder())
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=4096,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                         tie_word_embeddings=True)  # fmt: skip
    folder = tmp_path_factory.mktemp("tiny-chat")
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
