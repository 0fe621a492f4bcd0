#!/bin/bash
# Resumable: rerunning continues from <out>.checkpoint.
cd /work/main
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
exec .venv/bin/midlens train mudaf --model gemma3-270m --alpha 0 --heads-n 20 \
  --examples 2400 --batch 8 --lr 4e-4 --out runs/train/gemma3-270m-alpha0 \
  --device cpu --dtype float32 --max-minutes 58 --no-progress
