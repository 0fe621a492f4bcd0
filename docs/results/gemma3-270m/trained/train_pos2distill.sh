#!/bin/bash
# Pos2Distill for Gemma 3 270M on one CPU thread: the SmolLM2 recipe (docs/results/pos2distill/: K = 2 placements,
# 30-word paragraphs, batch 4, lr 3e-4) with the teacher at slot 1 (`--advantage first`: no 10-slot sweep of this
# model's train split exists to measure its best slots), 20 planned steps. Resumable: rerun with the same flags.
cd "$(dirname "$0")/../../../.."
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
exec .venv/bin/midlens train pos2distill --model gemma3-270m --advantage first --examples 80 --batch 4 --lr 3e-4 \
  --placements 2 --max-words 30 --device cpu --dtype float32 --no-progress --max-minutes "${MAX_MINUTES:-35}" \
  --out runs/train/gemma3-270m-pos2distill
