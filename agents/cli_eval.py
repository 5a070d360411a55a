"""``treegym eval``: run an agent on an env and print EM / F1 / success with 95% intervals."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from treegym.agents.policy import SamplingParams
from treegym.options import float_in, int_in, json_object_option

MAX_EPISODES = 100_000  # --n: more is a mistake (10**12 once ran out of memory building the task list)
MAX_NEW_TOKENS = 1 << 20
MAX_TEMPERATURE = 100.0  # far past any sampler's useful range; above it the draw is uniform anyway

_AGENT_HELP = (
    "heuristic | oracle | smollm2 | a local HF model folder | openai:URL[#model] | rank:MODEL | module:callable "
    "(heuristic/oracle: the scripted experts registered for the env (treegym.agents.experts), e.g. the QA agents on "
    "TreeSearchQA/WebSearchQA, the expert walkthrough as oracle on TextHousehold; rank:smollm2 or "
    "rank:MODEL_FOLDER plays the listed command the model finds most likely, on TextHousehold-Train-v0)"
)


def add_commands(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "eval",
        help="evaluate an agent on an env (EM, F1, success with 95%% intervals)",
        description="Run AGENT on N tasks of ENV and print EM, F1 and success with 95% intervals "
        "(Wilson for rates, bootstrap for means), average turns and tool calls. Writes "
        "traces.jsonl and report.json to --out; --trees also writes trees.html. Exits 1 when every "
        "episode failed (the agent raised), 2 on a usage error.",
    )
    p.add_argument("--agent", required=True, help=_AGENT_HELP)
    p.add_argument("--env", required=True, help="env id: TreeSearchQA-v0, WebSearchQA-v0, TextHousehold-v0")
    p.add_argument("--n", type=int_in(1, MAX_EPISODES), default=20, help="episodes: the first N tasks of the split, as train's held-out prompts "
                   "(default 20; a run's model, RUN/final, replays its run's held-out protocol instead: RUN/protocol.json)")
    p.add_argument("--split", default="auto", help="task split (default auto: the env's held-out split, dev for QA, seen for household)")
    p.add_argument("--seed", type=int_in(0), default=0, help="seed of the tree search with --trees (default 0)")
    p.add_argument("--out", default=None, help="folder for traces.jsonl, report.json, trees.html")
    p.add_argument("--trees", action="store_true",
                   help="policy agents: also sample Tree-GRPO trees (m=2 n=2 l=1 k=3) and write trees.html")
    p.add_argument("--tree-prompts", type=int_in(1), default=4, help="tasks to grow trees for with --trees (default 4)")
    p.add_argument("--max-turns", type=int, default=None, help="cap on turns per episode (default: the env's)")
    p.add_argument("--max-new-tokens", type=int_in(1, MAX_NEW_TOKENS), default=128,
                   help="policy and openai: agents: tokens per turn (default 128)")
    p.add_argument("--temperature", type=float_in(0.0, MAX_TEMPERATURE), default=0.0, help="policy and openai: agents: 0 = greedy (default)")
    p.add_argument("--model", default=None,
                   help="openai:URL agents: the model to ask for (default: the server's only model; URL#model wins)")
    p.add_argument("--mode", choices=("chat", "raw"), default="chat", help="policy agents: context format")
    p.add_argument("--env-kwargs", default=None,
                   help='JSON of extra env arguments, e.g. \'{"corpus_limit": 300}\'')
    p.add_argument("--json", action="store_true", help="print the report as JSON instead of a table")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run_eval)


def run_eval(args: argparse.Namespace) -> int:
    from treegym.agents.eval import evaluate, report_dict

    env_kwargs = json_object_option(args.env_kwargs) or None
    report = evaluate(
        args.agent, args.env, args.n, split=args.split, seed=args.seed, out=args.out, trees=args.trees,
        env_kwargs=env_kwargs, max_turns=args.max_turns,
        params=SamplingParams(temperature=args.temperature, max_new_tokens=args.max_new_tokens),
        mode=args.mode, tree_prompts=args.tree_prompts, progress=not args.no_progress, model=args.model,
    )
    if args.json:
        print(json.dumps(report_dict(report), indent=2))
    else:
        print(report.table())
        for err in report.errors:
            print(f"failed: {err}")
        for kind, path in report.files.items():
            print(f"{kind}: {path}")
    if report.errors and len(report.errors) == report.n:
        # Exit 1 (not 2, a usage error): the run happened, but no episode got a score.
        print(f"treegym eval: error: every episode failed ({report.n} of {report.n}); first: {report.errors[0]}",
              file=sys.stderr)
        return 1
    return 0
