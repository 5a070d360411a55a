#!/usr/bin/env bash
# Web round: GRPO, Tree-GRPO, TreeOPSD and fork+moves on WebSearchQA-v0, two one-thread lanes side by side.
set -u
cd /work/main && source .venv/bin/activate && export TREEGYM_HOME=$PWD/.cache/treegym
COMMON=(--env WebSearchQA-v0 --seeds 0 1 2 --budget 8000 --eval-n 128 --eval-every 0 --sampler.temperature=0.7
        --lr grpo=5e-6 fork+moves=5e-6 tree-grpo=2e-6 treeopsd=2e-6 --out runs/web-b8000)
echo "warm start $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
python -c "
from treegym.trainers.recipe import warm_start
from treegym.trainers.config import load_config
print(warm_start(load_config(None, [('env', 'WebSearchQA-v0'), ('sampler.temperature', '0.7')])).folder)"
lane() { OMP_NUM_THREADS=1 python benchmarks/rl_real_envs.py "${COMMON[@]}" --methods "$@"; }
echo "lanes $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
( lane grpo; echo "A1 $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"; lane treeopsd ) > runs/web_laneA.log 2>&1 &
( lane fork+moves; echo "B1 $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"; lane tree-grpo ) > runs/web_laneB.log 2>&1 &
wait
echo "end $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
