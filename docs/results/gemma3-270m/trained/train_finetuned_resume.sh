#!/bin/bash
# Resumes runs/train/gemma3-270m-alpha0 from its checkpoint (same flags; the saved head scores instead of rescoring).
cd /work/main
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
exec .venv/bin/midlens train mudaf --model gemma3-270m --alpha 0 --heads-file runs/train/gemma3-270m-alpha0.heads.json \
  --examples 2400 --batch 8 --lr 4e-4 --out runs/train/gemma3-270m-alpha0 \
  --device cpu --dtype float32 --max-minutes 22 --no-progress
