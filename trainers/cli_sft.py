"""``treegym sft``: a supervised warm start from expert episodes, saved for ``treegym train --model``."""

from __future__ import annotations

import argparse
from typing import Any

from treegym.options import json_object_option

DESCRIPTION = """\
Supervised warm start before RL. An untrained small model rarely writes a well-formed
<search>...</search> or <answer>...</answer> turn, so every RL reward (and advantage) is 0.
This command imitates an expert first:

  1. runs a scripted expert (--expert heuristic|oracle) on the training split of --env,
     through the same env and turn budget as `treegym train` (or reads --traces, a
     traces.jsonl from `treegym eval --out DIR`), and keeps its correct episodes;
  2. lays each episode out in the RL context format (chat template or raw text); only the
     expert's action tokens are trained, the prompt and observations are context;
  3. trains the model with AdamW on that masked next-token loss;
  4. saves a Hugging Face model folder (safetensors, tokenizer, sft.json) to --out;
  5. prints EM and the rate of well-formed actions on --eval-n held-out prompts (greedy),
     before and after.

The default expert is `heuristic`: it reads only the chat (question and retrieved passages),
so everything it does can be learnt from the text the model sees. The oracle searches the
gold supporting titles, which a model cannot see in its context.
"""

EXAMPLES = """\
examples:
  treegym sft --out runs/sft-smollm2               # 64 heuristic episodes, 1 epoch (2 CPU cores: minutes)
  treegym train --model runs/sft-smollm2           # then RL from the warm-started model
  treegym eval --agent runs/sft-smollm2 --env TreeSearchQA-v0 --n 50
  treegym eval --agent oracle --env TreeSearchQA-v0 --split train --n 300 --out traces/
  treegym sft --traces traces/traces.jsonl --out runs/sft-from-traces
"""


def add_commands(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "sft",
        help="supervised warm start on expert episodes (then: treegym train --model OUT)",
        description=DESCRIPTION,
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", default="runs/sft-smollm2", help="model folder to write (default runs/sft-smollm2)")
    p.add_argument("--model", default="smollm2", help="smollm2, or a local HF model folder (default smollm2)")
    p.add_argument("--env", default="TreeSearchQA-v0", help="env id (default TreeSearchQA-v0, with the BM25 index as in train)")
    p.add_argument("--env-kwargs", default=None, help='JSON of extra env arguments, e.g. \'{"corpus_limit": 300}\'')
    p.add_argument("--expert", default="heuristic", help="scripted expert: heuristic (default) or oracle")
    p.add_argument("--traces", default=None, help="read episodes from this traces.jsonl (or its folder) instead of running an expert")
    p.add_argument("--episodes", type=int, default=64, help="expert episodes to run (default 64)")
    p.add_argument("--keep-wrong", action="store_true", help="also imitate episodes whose answer was wrong")
    p.add_argument("--epochs", type=int, default=1, help="passes over the episodes (default 1)")
    p.add_argument("--lr", type=float, default=1e-4, help="AdamW learning rate (default 1e-4; warm-up 10%%, linear decay)")
    p.add_argument("--batch-size", type=int, default=8, help="episodes per optimiser step (default 8)")
    p.add_argument("--micro-batch-size", type=int, default=4, help="episodes per forward/backward (default 4)")
    p.add_argument("--lora", action="store_true", help="train LoRA adapters (merged into the saved weights)")
    p.add_argument("--max-turns", type=int, default=2, help="turn budget, as train's sampler.max_turns (default 2)")
    p.add_argument("--max-new-tokens", type=int, default=48,
                   help="tokens per action, as train's sampler.max_new_tokens; longer expert actions are dropped (default 48)")
    p.add_argument("--mode", choices=("auto", "chat", "raw"), default="auto", help="context format (default auto: chat if the tokenizer has a template)")
    p.add_argument("--eval-n", type=int, default=32, help="held-out prompts for EM before/after (0 = skip; default 32)")
    p.add_argument("--seed", type=int, default=0, help="seed of the episode draw, shuffling and init (default 0)")
    p.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=run_sft_command)


def run_sft_command(args: argparse.Namespace) -> int:
    from treegym.trainers.sft import SFTConfig, run_sft

    env_kwargs: dict[str, Any] = json_object_option(args.env_kwargs)
    cfg = SFTConfig(
        out=args.out, model=args.model, env=args.env, env_kwargs=env_kwargs, expert=args.expert,
        traces=args.traces, episodes=args.episodes, only_correct=not args.keep_wrong, epochs=args.epochs,
        lr=args.lr, batch_size=args.batch_size, micro_batch_size=args.micro_batch_size, lora=args.lora,
        max_turns=args.max_turns, max_new_tokens=args.max_new_tokens, mode=args.mode, eval_n=args.eval_n,
        seed=args.seed, device=args.device,
    )
    result = run_sft(cfg, progress=not args.no_progress)
    print(summary_table(result))
    print(f"next: treegym train --model {result.folder}")
    return 0


def summary_table(result: Any) -> str:
    def fig(score: Any, name: str) -> str:
        return "n/a" if score is None else f"{100 * score.mean(name):.1f}%"

    rows = [
        ("episodes", f"{result.examples} (dropped {sum(result.dropped.values())}: {result.dropped})"),
        ("action tokens", f"{result.label_tokens:,}"),
        ("steps", str(result.steps)),
        ("loss first -> last", f"{result.loss_first:.3f} -> {result.loss_last:.3f}"),
        ("success before", fig(result.before, "success")),
        ("success after", fig(result.after, "success")),
        ("well-formed before", fig(result.before, "well_formed")),
        ("well-formed after", fig(result.after, "well_formed")),
        ("time", f"{result.seconds:.0f} s"),
        ("model folder", str(result.folder)),
    ]
    width = max(len(k) for k, _ in rows)
    line = "-" * (width + 3 + max(len(v) for _, v in rows))
    return "\n".join([line, *(f"{k:<{width}}   {v}" for k, v in rows), line])
