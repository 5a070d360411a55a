"""How the admissible-commands cap of TextHousehold-v0(list_admissible=True) behaves, measured.

Plays the heuristic (which chooses from the listed commands) on the first ``--n`` tasks of a
split (the tasks ``treegym eval --n`` and a train run's held-out prompts take) with the training
variant's 10-turn budget, and prints, over every observation it sees:
how many commands are admissible, how many are listed, how often the cap bites, the length of
the full and the listed "Your admissible actions ..." line in SmolLM2 tokens, where the
heuristic's choice sits in the list, the tokens of a whole episode, and the success of the
heuristic and of an agent that always plays the first listed command (the ranking alone).

    python benchmarks/household_listing.py --split seen --n 100
"""

from __future__ import annotations

import argparse
import statistics
from collections import Counter

import gymnasium as gym

import treegym  # noqa: F401  (registers the envs)
from treegym.agents.household import HouseholdHeuristic
from treegym.agents.models import smollm2_folder
from treegym.agents.rollout.episode import run_episode
from treegym.envs.core import success
from treegym.envs.household import listing


class FirstListed:
    """Plays the first listed command: what the relevance order alone achieves."""

    def act(self, messages: list[dict[str, str]]) -> str:
        return (listing.split_observation(messages[-1]["content"])[1] or ["look"])[0]


def spread(xs: list[float]) -> str:
    return f"min {min(xs):.0f}, median {statistics.median(xs):.0f}, p90 {statistics.quantiles(xs, n=10)[-1]:.0f}, max {max(xs):.0f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--split", default="seen")
    ap.add_argument("--n", type=int, default=100)
    ap.add_argument("--max-turns", type=int, default=10)
    args = ap.parse_args()
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_folder())
    env = gym.make("TextHousehold-Train-v0", split=args.split)
    u = env.unwrapped
    ids = u.task_ids()[: args.n]
    full, shown, full_tok, shown_tok, episode_tok, wins, first_wins = [], [], [], [], [], [], []
    where: Counter[int] = Counter()
    agent = HouseholdHeuristic()
    for task_id in ids:
        obs, info = env.reset(options={"task_id": task_id})
        messages = [{"role": "user", "content": obs}]
        for _ in range(args.max_turns):
            admissible = [c for c in info["admissible_commands"] if c != "help"]
            listed = listing.split_observation(obs)[1] or []
            full.append(len(admissible))
            shown.append(len(listed))
            full_tok.append(len(tok.encode(listing.actions_line(admissible))))
            shown_tok.append(len(tok.encode(listing.actions_line(listed))))
            action = agent.act(messages)
            where[listed.index(action) if action in listed else -1] += 1
            obs, _, terminated, truncated, info = env.step(action)
            messages += [{"role": "assistant", "content": action}, {"role": "user", "content": obs}]
            if terminated or truncated:
                break
        wins.append(success(info))
        episode_tok.append(sum(len(tok.encode(m["content"])) for m in messages))
        first_wins.append(success(run_episode(env, FirstListed(), options={"task_id": task_id}, max_turns=args.max_turns).info))
    bites = sum(s < f for s, f in zip(shown, full))
    print(f"{len(full)} observations of the heuristic on {len(ids)} {args.split} tasks ({args.max_turns} turns); "
          f"cap: top {u.list_top_n} unless all fit in {u.list_max_tokens} tokens")
    print(f"  admissible commands (help excluded): {spread(full)}")
    print(f"  listed commands:                     {spread(shown)}")
    print(f"  the cap bites on {bites} of {len(full)} observations ({bites / len(full):.0%})")
    print(f"  full list line, SmolLM2 tokens:      {spread(full_tok)}")
    print(f"  listed line, SmolLM2 tokens:         {spread(shown_tok)}")
    print(f"  episode text, SmolLM2 tokens:        {spread(episode_tok)}")
    total = sum(where.values())
    print("  the heuristic's choice in the list:  " + ", ".join(
        f"{'not listed' if k < 0 else f'#{k + 1}'} {v / total:.0%}" for k, v in sorted(where.items())))
    print(f"  success: heuristic {sum(wins):.0f}/{len(ids)}, always the first listed command {sum(first_wins):.0f}/{len(ids)}")


if __name__ == "__main__":
    main()
