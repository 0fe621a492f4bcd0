#!/bin/bash
# Not resumable (a search, no checkpoint): rerun whole.
cd /work/main
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
exec .venv/bin/midlens train channel-scaling --model gemma3-270m --strings 8 --length 500 --candidates 4 \
  --examples 8 --batch 1 --max-words 40 --device cpu --dtype float32 --out runs/train/chs-gemma3-270m
