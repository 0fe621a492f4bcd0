#!/usr/bin/env bash
# MoICE router training for SmolLM2-135M on one CPU thread, a one-hour budget (resumable: rerun this script).
set -x
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 HF_HUB_OFFLINE=1
source .venv/bin/activate
python -m midlens.cli train moice --model smollm2-135m --examples 400 --batch 4 --lr 3e-3 --warmup 0.2 \
  --max-words 40 --max-minutes 60 --device cpu --out runs/moice-smollm2
echo TRAIN DONE
