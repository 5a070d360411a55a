"""GPU check of the vLLM policy backend, prepared to run as one short script on a lent GPU.

    python benchmarks/check_vllm.py [--batch 64] [--max-new-tokens 64]

Steps: convert/load SmolLM2 (safetensors folder from ``load_model``), start ``VLLMPolicy``
(prefix caching on, eager mode to keep start-up short), sample a tree-shaped batch (one
Search-R1 prompt, branches sharing it), and check:

1. every sampled token has a log-prob, and they match a transformers forward pass over the
   same tokens (bf16 engine against fp32 reference: mean |diff| <= 0.05, max <= 0.5);
2. stop strings end turns (``finish_reason == "stop"`` and the text ends with one);
3. the second call over the same contexts is served from the prefix cache (reused tokens);
4. ``load_weights`` with the reference model's own weights leaves greedy output unchanged;
5. one real training step with ``sampler.backend=vllm`` (the loop's own setup/sample/train_step
   on ProbeKeys-v0, an entropy bonus so that the update moves the weights even when every
   reward is 0): sample, update, push the weights, sample again, and check that the new
   samples' log-probs are those of the updated weights (|vLLM - new| <= 0.05 on average and at
   most half of |vLLM - old|), i.e. they come from the new weights.

Prints tokens/s. Without a GPU or without vllm it prints "SKIPPED: no GPU/vllm" and exits 0.
Exit code 1 when a check fails.
"""

from __future__ import annotations

import argparse
import sys
import time


def _skip_reason() -> str | None:
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA device"
    try:
        import vllm  # noqa: F401
    except ImportError:
        return "vllm is not installed (pip install 'treegym[vllm]')"
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2", help="'smollm2' or a local HF model folder")
    parser.add_argument("--batch", type=int, default=64, help="contexts per generate call")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    args = parser.parse_args()

    reason = _skip_reason()
    if reason:
        print(f"SKIPPED: no GPU/vllm ({reason})")
        return 0

    import torch

    from treegym.agents.chat import chat_prompt_ids, text_ids
    from treegym.agents.models import load_model
    from treegym.agents.policy import SamplingParams
    from treegym.agents.vllm_policy import VLLMPolicy
    from treegym.envs.tree_search_qa import TreeSearchQAEnv
    from treegym.retrieval_index.qa_files import SEARCH_R1_PROMPT

    failures: list[str] = []
    ref_model, tok = load_model(args.model, device="cuda", dtype=torch.float32)
    t0 = time.perf_counter()
    policy = VLLMPolicy(args.model, gpu_memory_utilization=0.3, max_model_len=4096, dtype="bfloat16", enforce_eager=True)
    print(f"vLLM engine up in {time.perf_counter() - t0:.1f} s")

    prompt = chat_prompt_ids(
        tok, [{"role": "user", "content": SEARCH_R1_PROMPT.format(question="Who wrote the novel Dracula?")}]
    )
    openings = ["<think>", "<think> I need", "<search>", "<think> The novel"]
    contexts = [prompt + text_ids(tok, openings[i % len(openings)]) for i in range(args.batch)]
    params = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=args.max_new_tokens, stop=TreeSearchQAEnv.action_stops, seed=1)

    t0 = time.perf_counter()
    gens = policy.generate(contexts, params)
    seconds = time.perf_counter() - t0
    generated = sum(len(g.token_ids) for g in gens)
    print(f"batch {args.batch}: {generated} tokens in {seconds:.2f} s = {generated / seconds:.0f} tokens/s")
    print(f"stats after call 1: {policy.stats}")

    # 1. log-probs against transformers (temperature 1: raw log-probs on both sides).
    diffs = []
    for ctx, gen in list(zip(contexts, gens))[:8]:
        if len(gen.logprobs) != len(gen.token_ids):
            failures.append("a generation lacks log-probs")
            continue
        with torch.no_grad():
            logits = ref_model(torch.tensor([ctx + list(gen.token_ids)], device="cuda")).logits[0].float()
        logp = torch.log_softmax(logits, dim=-1)
        ref = [logp[len(ctx) - 1 + j, t].item() for j, t in enumerate(gen.token_ids)]
        diffs += [abs(a - b) for a, b in zip(gen.logprobs, ref)]
    mean_diff, max_diff = sum(diffs) / max(len(diffs), 1), max(diffs, default=0.0)
    print(f"log-prob |vLLM - HF|: mean {mean_diff:.4f}, max {max_diff:.4f} over {len(diffs)} tokens")
    if mean_diff > 0.05 or max_diff > 0.5:
        failures.append(f"log-probs differ from transformers (mean {mean_diff:.3f}, max {max_diff:.3f})")

    # 2. stop strings.
    stopped = [g for g in gens if g.finish_reason == "stop" and any(g.text.endswith(s) for s in TreeSearchQAEnv.action_stops)]
    print(f"turns ended by a stop string: {len(stopped)}/{len(gens)}")
    bad = [g for g in gens if g.finish_reason == "length" and len(g.token_ids) != args.max_new_tokens]
    if bad:
        failures.append("a 'length' turn is shorter than max_new_tokens")

    # 3. prefix caching.
    before = policy.stats.reused_tokens
    t0 = time.perf_counter()
    policy.generate(contexts, params)
    reused = policy.stats.reused_tokens - before
    print(f"call 2 over the same contexts: {reused} prompt tokens from the prefix cache, "
          f"{time.perf_counter() - t0:.2f} s")
    if reused <= 0:
        failures.append("prefix caching reused nothing on an identical second call")

    # 4. weight sync.
    greedy = SamplingParams(temperature=0.0, max_new_tokens=16, stop=(), seed=0)
    first = [g.token_ids for g in policy.generate(contexts[:4], greedy)]
    t0 = time.perf_counter()
    policy.load_weights((name, p.detach()) for name, p in ref_model.state_dict().items())
    print(f"load_weights: {time.perf_counter() - t0:.2f} s")
    second = [g.token_ids for g in policy.generate(contexts[:4], greedy)]
    if first != second:
        failures.append("greedy output changed after loading the same weights")

    del policy
    torch.cuda.empty_cache()
    training_step_check(args.model, failures)

    for failure in failures:
        print(f"FAIL: {failure}")
    print("OK" if not failures else f"{len(failures)} check(s) failed")
    return 1 if failures else 0


def training_step_check(model: str, failures: list[str]) -> None:
    """Sample, update, push, sample again through the training loop with the vLLM backend."""
    import copy
    import tempfile

    import torch

    from treegym.trainers import loop, parallel
    from treegym.trainers.config import load_config

    out = tempfile.mkdtemp(prefix="check-vllm-")
    cfg = load_config(overrides=[
        ("algo", "tree-grpo"), ("env", "ProbeKeys-v0"), ("model", model), ("sampler.backend", "vllm"),
        ("sampler.max_new_tokens", 8), ("sampler.ignore_eos", True), ("sampler.max_turns", 2),
        ("prompts_per_step", 4), ("optim.lr", 1e-4), ("optim.mini_batch_size", 24), ("optim.micro_batch_size", 8),
        ("optim.skip_empty_steps", False), ("loss.entropy_coef", 0.05), ("run.eval_n", 0), ("run.out_dir", out), ("run.tensorboard", False),
        ("sampler.vllm_gpu_memory", 0.25)])  # fmt: skip
    dist, device = parallel.setup_distributed(cfg.model_opts.device)
    folder, _lock = loop._open_folder(cfg, dist)  # the lock is held while the check runs
    run = loop.setup(cfg, folder, dist, device)
    old = copy.deepcopy(run.model).eval()
    t0 = time.perf_counter()
    batch = loop.sample(run)
    metrics = loop.train_step(run, batch)  # the update, then the weight push
    print(f"training step with vLLM rollouts: {time.perf_counter() - t0:.1f} s, reward {metrics['reward']:.3f}, "
          f"{run.policy.weight_pushes} weight push(es)")
    if run.policy.weight_pushes != 1 or run.policy.asleep:
        failures.append("the training step did not wake the engine and push the weights once")
    contexts = [list(r.token_ids[:-1]) for r in batch.rollouts[:8]]
    from treegym.agents.policy import SamplingParams

    gens = run.policy.generate(contexts, SamplingParams(temperature=1.0, max_new_tokens=16, stop=(), seed=3))
    gaps = {"new": [], "old": []}
    for ctx, gen in zip(contexts, gens):
        ids = torch.tensor([ctx + list(gen.token_ids)], device=device)
        for name, m in (("new", run.model), ("old", old)):
            with torch.no_grad():
                logp = torch.log_softmax(m(ids).logits[0].float(), dim=-1)
            ref = [logp[len(ctx) - 1 + j, t].item() for j, t in enumerate(gen.token_ids)]
            gaps[name] += [abs(a - b) for a, b in zip(gen.logprobs, ref)]
    new, stale = (sum(v) / max(len(v), 1) for v in (gaps["new"], gaps["old"]))
    print(f"after the push, |vLLM - updated HF| = {new:.4f}, |vLLM - pre-update HF| = {stale:.4f}")
    if not (new <= 0.05 and new <= stale / 2):
        failures.append(f"samples after the push do not follow the new weights (new {new:.3f}, old {stale:.3f})")
    parallel.teardown_distributed(dist)


if __name__ == "__main__":
    sys.exit(main())
