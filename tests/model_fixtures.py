"""The SmolLM2 fixture shared by the policy and server tests: loaded once per test session."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def smollm2():
    """(model, tokenizer) of the embedded SmolLM2-135M-Instruct, on CPU, fp32."""
    import torch

    from treegym.agents.models import load_model

    torch.manual_seed(0)
    return load_model("smollm2", device="cpu")
