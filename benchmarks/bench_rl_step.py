"""One RL step of the main job, taken apart: sampling and the update, each way side by side.

The workload is the default ``treegym train`` step (TreeSearchQA-v0, the default algorithm and
tree shape) from the cached warm start when there is one (``--model`` otherwise), sampled by the
run's own code (``trainers.loop.setup`` / ``sample``). Then, on that same batch and from the same
weights, the update is run

- per row: every kept leaf forwarded as its own padded sequence (``optim.pack=false``, the old
  update), and
- tree-packed: each distinct token of a micro-batch forwarded once (``optim.pack=true``);

and the figures printed side by side: seconds, tokens the decoder forwarded, the unique/total
ratio, and the peak RSS of each (reset between them through ``/proc/self/clear_refs``).

For the sampler: the run's ``HFPolicy`` on the batch's first-turn contexts against raw HF
``generate`` on the same contexts (left-padded, same token budget), generated tokens/s, and the
machine's matmul roofline (GFLOP/s of a ``[tokens x hidden] @ [hidden x 4 hidden]`` product, fp32
and bf16) so that a tokens/s figure can be read against what the cores can do.

Give the load average with every figure: this machine has 2 cores.

    python benchmarks/bench_rl_step.py                 # the default QA step
    python benchmarks/bench_rl_step.py --algo grpo --reps 2 --json out.json
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from treegym.errors import TreegymError
from treegym.trainers import logprobs, loop, packing, parallel
from treegym.trainers.config import OptimConfig, load_config
from treegym.trainers.parallel import Dist


def peak_rss_reset() -> None:
    """Start a new peak-RSS window (Linux: VmHWM is reset by writing 5 to clear_refs)."""
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


def peak_rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def with_bf16(cfg: Any, on: bool) -> Any:
    """``cfg`` with training's CPU bf16 autocast forced on or off."""
    return dataclasses.replace(cfg, model_opts=dataclasses.replace(cfg.model_opts, cpu_bf16="on" if on else "off"))


def update_once(run: Any, batch: Any, weights: dict[str, torch.Tensor], pack: bool, micro: int,
                bf16: bool = False, fused: bool = True) -> dict[str, float]:
    """``train_step`` on ``batch`` from ``weights``: its seconds and counts. The optimiser is a fresh
    AdamW whose state is made by one step on zero gradients first (weights unchanged), as it is from
    a run's second step on: ``fused`` is the run's (``parallel.adamw``), else torch's default
    (``foreach``, the update before it)."""
    run.model.load_state_dict(weights)
    run.cfg = dataclasses.replace(with_bf16(run.cfg, bf16),
                                  optim=dataclasses.replace(run.cfg.optim, pack=pack, micro_batch_size=micro))
    run.updater.cfg = run.cfg
    params = run.updater.params
    run.updater.optimizer = (parallel.adamw(params, run.cfg.optim.lr, 0.0) if fused
                             else torch.optim.AdamW(params, lr=run.cfg.optim.lr))
    for p in params:
        p.grad = torch.zeros_like(p)
    run.updater.optimizer.step()
    run.updater.optimizer.zero_grad(set_to_none=True)
    run.sample_seconds = 0.0
    torch.manual_seed(0)
    peak_rss_reset()
    t0, c0 = time.perf_counter(), time.process_time()
    metrics = loop.train_step(run, batch)
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"seconds": seconds, "cpu_seconds": cpu, "peak_rss_mb": peak_rss_mb(), "forwarded": metrics["update_unique_tokens"],
            "row_tokens": metrics["update_row_tokens"], "ratio": metrics["update_unique_ratio"],
            "loss": float(metrics.get("pg_loss", float("nan")))}


def sample_timed(run: Any, generator_state: torch.Tensor, decoder_bf16: bool) -> tuple[float, Any]:
    """The run's first step sampled again from its start (same prompts, seed and generator stream),
    by the fp32 forward or the bf16 decoder (``FastDecoder``); its seconds and batch."""
    policy = run.engine.policy
    policy.bf16 = decoder_bf16
    policy._built_version = -1  # build (or drop) the bf16 decoder for these weights
    policy.clear_cache()
    policy.generator.set_state(generator_state)
    run.state.data_position = 0
    t0 = time.perf_counter()
    batch = loop.sample(run)
    return time.perf_counter() - t0, batch


def bf16_agreement(run: Any, batch: Any) -> dict[str, float]:
    """Log-probs of the batch's action tokens under the trainer's scorer, fp32 against bf16 autocast."""
    from treegym.trainers import update as upd

    pad = run.tokenizer.pad_token_id if run.tokenizer.pad_token_id is not None else 0
    data = logprobs.pad_rollouts(batch.rollouts, pad)
    fp32 = upd.score(run.scorer, data, with_bf16(run.cfg, False), run.device)
    bf16 = upd.score(run.scorer, data, with_bf16(run.cfg, True), run.device)
    mask = data.mask.bool()
    diff = (bf16 - fp32).abs()[mask]
    nll32, nll16 = float(-fp32[mask].mean()), float(-bf16[mask].mean())
    return {"logp_abs_diff_mean": float(diff.mean()), "logp_abs_diff_max": float(diff.max()),
            "nll_fp32": nll32, "nll_bf16": nll16, "nll_rel_diff": abs(nll16 - nll32) / max(abs(nll32), 1e-9),
            "tokens": int(mask.sum())}


def raw_generate(model: Any, tokenizer: Any, contexts: list[list[int]], new_tokens: int) -> tuple[float, int]:
    """HF ``generate`` on ``contexts`` (left-padded), sampling exactly ``new_tokens`` each."""
    width = max(len(c) for c in contexts)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    ids = torch.tensor([[pad] * (width - len(c)) + c for c in contexts])
    attn = torch.tensor([[0] * (width - len(c)) + [1] * len(c) for c in contexts])
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=attn, max_new_tokens=new_tokens,
                             min_new_tokens=new_tokens, do_sample=True, temperature=1.0, top_p=1.0, top_k=0,
                             pad_token_id=pad)
    return time.perf_counter() - t0, int((out.shape[1] - width) * len(contexts))


def policy_generate(policy: Any, contexts: list[list[int]], new_tokens: int) -> tuple[float, int]:
    from treegym.agents.policy import SamplingParams

    policy.clear_cache()
    t0 = time.perf_counter()
    gens = policy.generate(contexts, SamplingParams(temperature=1.0, max_new_tokens=new_tokens, ignore_eos=True))
    return time.perf_counter() - t0, sum(len(g.token_ids) for g in gens)


def matmul_gflops(dtype: torch.dtype, rows: int, hidden: int, reps: int = 20) -> float:
    a = torch.randn(rows, hidden).to(dtype)
    b = torch.randn(hidden, 4 * hidden).to(dtype)
    a @ b  # warm-up
    t0 = time.perf_counter()
    for _ in range(reps):
        a @ b
    return 2 * rows * hidden * 4 * hidden * reps / (time.perf_counter() - t0) / 1e9


def update_gflop(model: Any, forwarded: float, scored: float) -> float:
    """Model compute of one update, in GFLOP: forward and backward (3 x 2 FLOPs per weight) of the
    decoder's weights for every forwarded token, and of the LM head for every scored token (the
    update applies the head only there). Attention's own products are left out (a few % here)."""
    head = model.get_output_embeddings().weight.numel()
    body = sum(p.numel() for p in model.parameters()) - model.get_input_embeddings().weight.numel()
    if model.get_output_embeddings().weight is not model.get_input_embeddings().weight:
        body -= head  # an untied head is counted with the scored tokens only
    return 6 * (body * forwarded + head * scored) / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="", help="model folder or 'smollm2' (default: the cached warm start of "
                        "the default run, else smollm2)")
    parser.add_argument("--algo", default="", help="algorithm (default: the main job's)")
    parser.add_argument("--prompts", type=int, default=0, help="prompts per step (default: the main job's)")
    parser.add_argument("--reps", type=int, default=2, help="update runs per variant (median reported)")
    parser.add_argument("--new-tokens", type=int, default=48, help="tokens per context in the sampler comparison")
    parser.add_argument("--json", default="", help="also write the figures to this file")
    parser.add_argument("--baseline-commit", default="", metavar="REV",
                        help="also take the step with the code of commit REV on the same workload, after the rest "
                        "(benchmarks/step_at_commit.py): 1298b91 is the code the issue 'Cash in the fork' was filed "
                        "against, its 'today'")
    parser.add_argument("--no-bf16", action="store_true", help="skip the bf16 variants (they run where the CPU has "
                        "bf16 matmul units)")
    args = parser.parse_args()

    from treegym.trainers.recipe import warm_start_folder

    run_overrides: list[tuple[str, str]] = []
    if args.algo:
        run_overrides.append(("algo", args.algo))
    if args.prompts:
        run_overrides.append(("prompts_per_step", str(args.prompts)))
    # the warm start is the main job's: its cache key holds the run's held-out settings, so it is looked
    # up before the benchmark turns evaluation off
    folder = warm_start_folder(load_config(overrides=run_overrides))
    cfg = load_config(overrides=[*run_overrides, ("run.eval_n", "0"), ("run.tensorboard", "false"),
                                 ("run.plots", "false"), ("run.trees_html", "false")])
    model = args.model or (str(folder) if folder.is_dir() else "smollm2")
    cfg = dataclasses.replace(cfg, model=model)
    bf16_units = parallel.cpu_has_bf16() and not args.no_bf16
    load = os.getloadavg()
    print(f"model {model}, algo {cfg.algo}, prompts/step {cfg.prompts_per_step}, torch threads "
          f"{torch.get_num_threads()}, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")

    with tempfile.TemporaryDirectory() as tmp:
        run = loop.setup(with_bf16(cfg, False), Path(tmp), Dist(), torch.device("cpu"))
        fresh = run.engine.policy.generator.get_state()
        sampled = {False: [], True: []} if bf16_units else {False: []}
        for _ in range(args.reps):
            for decoder_bf16 in sampled:
                seconds, got = sample_timed(run, fresh, decoder_bf16)
                sampled[decoder_bf16].append((seconds, got.budget.generated_tokens, got.budget.prefill_tokens))
                if not decoder_bf16:
                    batch = got  # every fp32 repeat samples this same batch: the update's
        run.engine.policy.bf16 = False
        sample_s = statistics.median(t for t, _, _ in sampled[False])
        sample16_s = statistics.median(t for t, _, _ in sampled[True]) if bf16_units else sample_s
        bud = batch.budget
        weights = copy.deepcopy(run.model.state_dict())
        # The baseline runs at the trainer's own micro-batch (4 rows), the one every family used before
        # the packed update; the run's micro-batch (the family's: TreeSearchQA forwards its whole
        # mini-batch at once, which packing affords) is what the new step uses.
        micro, base_micro = cfg.optim.micro_batch_size, OptimConfig().micro_batch_size
        # name: (pack, micro-batch, run attention, bf16, fused AdamW); "per-row" is the update before
        # packing, bf16 and the fused AdamW: the step's baseline
        variants = {"per-row": (False, base_micro, True, False, False),
                    "per-row, fused AdamW": (False, base_micro, True, False, True),
                    "packed, [P,P] mask": (True, base_micro, False, False, True), "packed": (True, base_micro, True, False, True)}
        if micro != base_micro:
            variants[f"packed, micro {micro}"] = (True, micro, True, False, True)
        if bf16_units:
            variants["packed, bf16"] = (True, micro, True, True, True)
        rows: dict[str, list[dict[str, float]]] = {name: [] for name in variants}
        for _ in range(args.reps):
            for name, (pack, size, runs, bf16, fused) in variants.items():
                # the ancestor-mask variant is the packed update before run attention (packing.py)
                logprobs.runs_supported = packing.runs_supported if runs else (lambda config: False)
                rows[name].append(update_once(run, batch, weights, pack, size, bf16, fused))
        logprobs.runs_supported = packing.runs_supported
        run.model.load_state_dict(weights)
        agreement = bf16_agreement(run, batch) if bf16_units else None
        contexts = [list(t.prompt_ids) for t in batch.trees]
        run.model.load_state_dict(weights)
        hf_s, hf_n = policy_generate(run.engine.policy, contexts, args.new_tokens)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            hf16_s, hf16_n = policy_generate(run.engine.policy, contexts, args.new_tokens) if bf16_units else (1.0, 0)
        raw_s, raw_n = raw_generate(run.model, run.tokenizer, contexts, args.new_tokens)
        # prefill alone: one new token after each (uncached) context
        hf_p, _ = policy_generate(run.engine.policy, contexts, 1)
        raw_p, _ = raw_generate(run.model, run.tokenizer, contexts, 1)
        context_tokens = sum(len(c) for c in contexts)
        dec_s, dec_n, dec_p = 1.0, 0, 1.0
        if bf16_units:
            run.engine.policy.bf16, run.engine.policy._built_version = True, -1
            dec_s, dec_n = policy_generate(run.engine.policy, contexts, args.new_tokens)
            dec_p, _ = policy_generate(run.engine.policy, contexts, 1)
            run.engine.policy.bf16, run.engine.policy._built_version = False, -1

    hidden = int(run.model.config.hidden_size)
    flops = {str(d).removeprefix("torch."): matmul_gflops(d, 256, hidden) for d in (torch.float32, torch.bfloat16)}
    med = {k: {f: statistics.median(r[f] for r in v) for f in v[0]} for k, v in rows.items()}
    base, new = med["per-row"], med["packed"]
    new_step = (sample16_s + med["packed, bf16"]["seconds"]) if bf16_units else sample_s + med["packed"]["seconds"]
    at_commit = None
    if args.baseline_commit:
        import step_at_commit

        print(f"\nthe step with the code of {args.baseline_commit} (same warm start, prompts, seed and tree shape)...",
              flush=True)
        at_commit = step_at_commit.run_at_commit(Path(__file__).resolve().parents[1], args.baseline_commit, model, cfg,
                                                 args.reps, torch.get_num_threads())
    print(f"\nsampling (the run's own sampler, fp32): {sample_s:.1f} s for {len(batch.rollouts)} trajectories, "
          f"{bud.generated_tokens} generated + {bud.prefill_tokens} prefilled tokens "
          f"({bud.generated_tokens / sample_s:.1f} generated tokens/s)")
    n_params = sum(p.numel() for p in run.model.parameters())
    achieved = 2 * n_params * (bud.generated_tokens + bud.prefill_tokens) / sample_s / 1e9
    print(f"  that is about {achieved:.0f} GFLOP/s of model compute (2 x {n_params / 1e6:.0f}M parameters per "
          f"prefilled or generated token): {achieved / flops['float32']:.0%} of the fp32 matmul roofline below")
    print(f"\nupdate on the same batch (micro-batch {base_micro} rows unless said; the run's own is {micro}), median of {args.reps}:")
    print(f"{'':22}{'seconds':>9}{'CPU s':>8}{'forwarded':>11}{'row tokens':>12}{'unique/total':>14}"
          f"{'peak RSS MB':>13}")
    for name, m in med.items():
        print(f"{name:22}{m['seconds']:>9.1f}{m['cpu_seconds']:>8.1f}{m['forwarded']:>11.0f}{m['row_tokens']:>12.0f}"
              f"{m['ratio']:>14.2f}{m['peak_rss_mb']:>13.0f}")
    speedup = base["seconds"] / new["seconds"]
    cpu_speedup = base["cpu_seconds"] / new["cpu_seconds"]
    print(f"packed update {speedup:.2f}x faster in wall time, {cpu_speedup:.2f}x in CPU time; the token ratio "
          f"predicts {1 / new['ratio']:.2f}x (gain/prediction {speedup * new['ratio']:.2f} wall, "
          f"{cpu_speedup * new['ratio']:.2f} CPU)")
    print(f"step (sampling + update): {sample_s + base['seconds']:.1f} s per-row -> {sample_s + new['seconds']:.1f} s "
          f"packed ({(sample_s + base['seconds']) / (sample_s + new['seconds']):.2f}x)")
    # How far the update is from the cores' limit, and what that leaves for a 3x faster step.
    scored = float(sum(sum(r.loss_mask) for r in batch.rollouts))  # per row: an upper bound when packed
    threads = torch.get_num_threads()
    for name in ("per-row", "packed"):
        work = update_gflop(run.model, med[name]["forwarded"], scored)
        print(f"  {name} update: {work:.0f} GFLOP of model compute in {med[name]['cpu_seconds']:.1f} CPU s = "
              f"{work / med[name]['cpu_seconds']:.0f} GFLOP/s per thread, "
              f"{work / med[name]['cpu_seconds'] / (flops['float32'] / threads):.0%} of the fp32 matmul roofline "
              f"per thread (at the roofline: {work / flops['float32']:.1f} s on {threads} thread(s))")
    floor = update_gflop(run.model, med["packed"]["forwarded"], scored) / flops["float32"]
    target = (sample_s + base["seconds"]) / 3
    print(f"  a 3x faster step is {target:.1f} s; the packed update alone at the fp32 roofline takes {floor:.1f} s, "
          f"which leaves {max(target - floor, 0):.1f} s for sampling (measured {sample_s:.1f} s)")
    if bf16_units:
        b16 = med["packed, bf16"]
        print(f"\nbf16 autocast in the update (this CPU has bf16 matmul units): packed update "
              f"{b16['seconds']:.1f} s against {new['seconds']:.1f} s fp32 ({new['seconds'] / b16['seconds']:.2f}x)")
        print(f"  step: per-row fp32 {sample_s + base['seconds']:.1f} s, packed fp32 {sample_s + new['seconds']:.1f} s, "
              f"packed bf16 {sample_s + b16['seconds']:.1f} s: {(sample_s + base['seconds']) / (sample_s + b16['seconds']):.2f}x "
              f"against per-row fp32, {(sample_s + new['seconds']) / (sample_s + b16['seconds']):.2f}x against packed fp32")
        gen16 = statistics.median(n for _, n, _ in sampled[True])
        print(f"\nsampling through the bf16 decoder (fast_decode.FastDecoder): {sample16_s:.1f} s against "
              f"{sample_s:.1f} s fp32 ({sample_s / sample16_s:.2f}x; {gen16:.0f} generated tokens against "
              f"{bud.generated_tokens}: the same prompts and seeds, other numerics)")
        print(f"  THE STEP, side by side: {sample_s:.1f} + {base['seconds']:.1f} = {sample_s + base['seconds']:.1f} s "
              f"(fp32 sampling, per-row update at micro-batch {base_micro}, foreach AdamW) -> {sample16_s:.1f} + {b16['seconds']:.1f} = "
              f"{sample16_s + b16['seconds']:.1f} s (bf16 decoder, packed bf16 update at micro-batch {micro}, fused AdamW): "
              f"{(sample_s + base['seconds']) / (sample16_s + b16['seconds']):.2f}x")
        print(f"  agreement on the batch's {agreement['tokens']} action tokens: log-prob |bf16 - fp32| mean "
              f"{agreement['logp_abs_diff_mean']:.4f} (max {agreement['logp_abs_diff_max']:.3f}); token NLL "
              f"{agreement['nll_fp32']:.4f} -> {agreement['nll_bf16']:.4f} ({agreement['nll_rel_diff']:.2%}); "
              f"train_step loss at micro-batch {micro} {med.get(f'packed, micro {micro}', new)['loss']:.5f} -> "
              f"{b16['loss']:.5f}")
    if at_commit is not None:
        old = at_commit["sample_seconds"] + at_commit["update_seconds"]
        print(f"\nTHE STEP against the code of {at_commit['commit']} on the same workload: {at_commit['sample_seconds']:.1f} + "
              f"{at_commit['update_seconds']:.1f} = {old:.1f} s (its sampler; its update at micro-batch "
              f"{at_commit['micro_batch_size']}; {at_commit['trajectories']} rollouts, {at_commit['generated_tokens']} "
              f"generated + {at_commit['prefill_tokens']} prefilled tokens) -> {new_step:.1f} s now: {old / new_step:.2f}x"
              + (f"; fields the old config lacks: {', '.join(at_commit['fields_missing_at_commit'])}"
                 if at_commit["fields_missing_at_commit"] else ""))
    print(f"\nsampler on the batch's {len(contexts)} first-turn contexts, {args.new_tokens} new tokens each:")
    print(f"  HFPolicy      {hf_n / hf_s:7.1f} generated tokens/s ({hf_s:.1f} s); prefill "
          f"{context_tokens / hf_p:.0f} tokens/s")
    if bf16_units:
        print(f"  HFPolicy, bf16 decoder {dec_n / dec_s:7.1f} generated tokens/s ({dec_s:.1f} s); prefill "
              f"{context_tokens / dec_p:.0f} tokens/s")
        print(f"  HFPolicy under bf16 autocast {hf16_n / hf16_s:7.1f} generated tokens/s ({hf16_s:.1f} s): why "
              "the bf16 sampler is a decoder of its own (inference_mode keeps no cast weights)")
    print(f"  HF generate   {raw_n / raw_s:7.1f} generated tokens/s ({raw_s:.1f} s); prefill "
          f"{context_tokens / raw_p:.0f} tokens/s")
    print("  matmul roofline " + ", ".join(f"{k} {v:.0f} GFLOP/s" for k, v in flops.items()))
    if args.json:
        Path(args.json).write_text(json.dumps({
            "load_average": load, "model": model, "algo": cfg.algo, "sample_seconds": sample_s,
            "sample_seconds_bf16_decoder": sample16_s if bf16_units else None, "sampled": {str(k): v for k, v in sampled.items()},
            "budget": dataclasses.asdict(bud), "update": rows, "update_median": med, "update_speedup": speedup, "update_cpu_speedup": cpu_speedup,
            "hf_policy_tokens_per_s": hf_n / hf_s, "hf_generate_tokens_per_s": raw_n / raw_s, "matmul_gflops": flops,
            "hf_policy_prefill_per_s": context_tokens / hf_p, "hf_generate_prefill_per_s": context_tokens / raw_p,
            "scored_tokens": scored, "threads": threads, "bf16_units": bf16_units, "bf16_agreement": agreement,
            "hf_policy_bf16_tokens_per_s": hf16_n / hf16_s if bf16_units else None,
            "hf_policy_bf16_decoder_tokens_per_s": dec_n / dec_s if bf16_units else None,
            "hf_policy_bf16_decoder_prefill_per_s": context_tokens / dec_p if bf16_units else None,
            "step_seconds": new_step, "at_commit": at_commit,
            "update_gflop": {k: update_gflop(run.model, v["forwarded"], scored) for k, v in med.items()},
        }, indent=2))


if __name__ == "__main__":
    try:
        main()
    except TreegymError as exc:  # a model that will not load, a context too long: say so, no traceback
        raise SystemExit(f"bench_rl_step: {exc}") from None
