#!/bin/bash
# MoICE routers for Gemma 3 270M on one CPU thread (the model frozen; each layer's experts relative to its own base).
# The SmolLM2 recipe (docs/results/smollm2-135m/moice/) with the schedule sized to what a shared 2-core CPU runs in
# the budget: 30 planned steps of 4 examples. Resumable: rerun with the same flags (a larger --max-minutes continues).
cd "$(dirname "$0")/../../../.."
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
exec .venv/bin/midlens train moice --model gemma3-270m --examples 120 --batch 4 --lr 3e-3 --warmup 0.2 \
  --max-words 40 --device cpu --dtype float32 --no-progress --max-minutes "${MAX_MINUTES:-35}" \
  --out runs/train/gemma3-270m-moice
