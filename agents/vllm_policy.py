"""The vLLM policy backend (GPU): the ``Policy`` interface over an in-process ``vllm.LLM``.

vLLM is an optional extra (``pip install 'treegym[vllm]'``) and is imported only when a
``VLLMPolicy`` is built. Prefix caching is on, so branches of one tree share the KV blocks of
their common prefix; ``stats.prefill_tokens`` counts the prompt tokens vLLM did not find in
its cache (``RequestOutput.num_cached_tokens``).

Log-probs: vLLM reports the sampled token's log-prob under the raw model distribution
(temperature 1, before top-p; its default ``logprobs_mode``). That equals ``HFPolicy`` at
T = 1, which is how the trainers sample; at other temperatures HFPolicy reports the tempered
distribution instead.

Weight sync: ``load_weights(named_tensors)`` pushes trained weights into the running engine
(the engine runs in this process, ``VLLM_ENABLE_V1_MULTIPROCESSING=0``, so the model object is
reachable; otherwise the weights go through ``collective_rpc`` to the workers) and then drops
the prefix cache, whose KV came from the old weights.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import Any

from treegym.agents.policy import Generation, PolicyStats, SamplingParams
from treegym.errors import MissingPackageError, TreegymError


def _import_vllm() -> Any:
    try:
        import vllm
    except ImportError as exc:
        raise MissingPackageError(
            "vllm", "the vLLM policy backend", install="pip install 'treegym[vllm]'"
        ) from exc
    return vllm


class VLLMPolicy:
    """A ``Policy`` over vLLM with prefix caching.

    Args:
        spec: ``"smollm2"`` (the converted safetensors folder) or a local HF model folder.
        gpu_memory_utilization, max_model_len, dtype, seed: passed to ``vllm.LLM``.
        llm_kwargs: any other ``vllm.LLM`` argument.
    """

    def __init__(
        self,
        spec: str = "smollm2",
        *,
        gpu_memory_utilization: float = 0.5,
        max_model_len: int = 8192,
        dtype: str = "auto",
        seed: int = 0,
        **llm_kwargs: Any,
    ) -> None:
        vllm = _import_vllm()
        from transformers import AutoTokenizer

        from treegym.agents.models import resolve_model_folder

        folder = resolve_model_folder(spec)
        # Keep the engine core in this process, so that trained weights can be loaded in place.
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        self._vllm = vllm
        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        self.llm = vllm.LLM(
            model=str(folder),
            enable_prefix_caching=True,
            gpu_memory_utilization=gpu_memory_utilization,
            max_model_len=max_model_len,
            dtype=dtype,
            seed=seed,
            **llm_kwargs,
        )
        self.stats = PolicyStats()

    def generate(self, contexts: Sequence[Sequence[int]], params: SamplingParams) -> list[Generation]:
        """Sample one continuation per context (shared prefixes hit vLLM's prefix cache)."""
        sampling = self._vllm.SamplingParams(
            n=1,
            temperature=params.temperature,
            top_p=params.top_p,
            max_tokens=params.max_new_tokens,
            stop=list(params.stop) or None,
            include_stop_str_in_output=True,
            logprobs=0,  # the sampled token's own log-prob only
            seed=params.seed,
            ignore_eos=params.ignore_eos,
        )
        prompts = [{"prompt_token_ids": [int(t) for t in c]} for c in contexts]
        outputs = self.llm.generate(prompts, sampling, use_tqdm=False)
        out = []
        for ctx, request in zip(contexts, outputs):
            done = request.outputs[0]
            ids = tuple(int(t) for t in done.token_ids)
            logprobs = tuple(float(step[tok].logprob) for tok, step in zip(ids, done.logprobs or []))
            if len(logprobs) != len(ids):
                raise TreegymError("vLLM returned no log-probs for some sampled tokens")
            finish = "length" if done.finish_reason == "length" else "stop"
            out.append(Generation(ids, logprobs, done.text, finish))
            cached = int(getattr(request, "num_cached_tokens", 0) or 0)
            self.stats.prefill_tokens += len(ctx) - cached
            self.stats.reused_tokens += cached
            self.stats.generated_tokens += len(ids)
        self.stats.calls += 1
        return out

    def load_weights(self, weights: Iterable[tuple[str, Any]]) -> None:
        """Load ``(name, tensor)`` pairs (HF parameter names) into the engine, then drop stale KV."""
        named = list(weights)
        model = self._local_model()
        if model is not None:
            model.load_weights(named)
        else:
            self.llm.collective_rpc(_load_on_worker, args=(named,))
        self.llm.reset_prefix_cache()

    def _local_model(self) -> Any:
        """The engine's torch model when the engine runs in this process, else None."""
        executor = getattr(getattr(self.llm, "llm_engine", None), "model_executor", None)
        worker = getattr(executor, "driver_worker", None)
        for path in (("worker", "model_runner", "model"), ("model_runner", "model")):
            obj = worker
            for name in path:
                obj = getattr(obj, name, None)
            if obj is not None and hasattr(obj, "load_weights"):
                return obj
        return None


def _load_on_worker(worker: Any, named: list[tuple[str, Any]]) -> None:
    """Runs inside each vLLM worker (``collective_rpc`` passes the worker first)."""
    worker.model_runner.model.load_weights(named)
