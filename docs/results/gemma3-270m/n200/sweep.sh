#!/usr/bin/env bash
# Gemma 3 270M, n = 200 sweeps. One run folder per corpus and group of methods; units go question by question with
# every method of the group, so a run stopped at any point holds paired rows on the same questions, and rerunning
# the same command resumes it. SQuAD first: the out-of-domain corpus the default rule reads for trained methods.
# From the repository root; runs/ is not committed (the rows ship gzipped beside this script).
set -u
export OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1
OUT=${OUT:-runs/gemma3-n200}
for D in squad hotpotqa; do
  for GROUP in "a baseline,attn-calibration,ms-poe,finetuned" "b channel-scaling,attention-buckets"; do
    set -- $GROUP
    midlens eval sweep --dataset $D --model gemma3-270m --n 200 --k 10 --positions 1,5,10 --prompt-style short \
      --max-new-tokens 16 --stop-at-line-end --batch-size 4 --max-words 100 --methods $2 --no-progress \
      --out $OUT/$D-$1 || exit 1
  done
done
