#!/bin/bash
# MuDAF (contrastive retrieval-head loss, alpha 0.7) for Gemma 3 270M on one CPU thread: the `finetuned` recipe of
# train_finetuned.sh (LoRA r16 q/k/v/o, lr 4e-4, batch 8, 80-word paragraphs) plus the contrastive loss on the heads
# scored there (runs/train/gemma3-270m-alpha0.heads.json: 20 prompts), 30 planned steps. Resumable: rerun.
cd "$(dirname "$0")/../../../.."
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
exec .venv/bin/midlens train mudaf --model gemma3-270m --heads-file runs/train/gemma3-270m-alpha0.heads.json \
  --examples 240 --batch 8 --lr 4e-4 --device cpu --dtype float32 --no-progress --max-minutes "${MAX_MINUTES:-35}" \
  --out runs/train/gemma3-270m-mudaf
