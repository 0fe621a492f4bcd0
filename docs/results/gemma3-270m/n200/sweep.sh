#!/usr/bin/env bash
# Gemma 3 270M, n = 200 sweeps. One run folder per corpus and group of methods; units go question by question with
# every method of the group, so a run stopped at any point holds paired rows on the same questions, and rerunning
# the same command resumes it (a folder as it ships here, rows gzipped, resumes too). SQuAD first: the corpus outside
# every trained method's training data, the only one the default rule reads for them.
#   a: baseline, attn-calibration, ms-poe, finetuned (both corpora)
#   c: the trained methods shipped since and the other RoPE methods on SQuAD (run as two shards, `--shard 0/2` and
#      `1/2` into squad-c0 / squad-c1, one thread each, then `midlens eval merge ... --out squad-c`); on HotpotQA,
#      where they were trained (in-domain: beside the decision), only the training-free rope-scaling
#   b: channel-scaling, attention-buckets (both corpora; attention-buckets runs 4 forwards a prompt: not run past
#      its first questions)
# From the repository root; runs/ is not committed (the rows ship gzipped beside this script).
set -u
export OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1
OUT=${OUT:-runs/gemma3-n200}
sweep() {  # corpus, group, methods, extra options
  midlens eval sweep --dataset "$1" --model gemma3-270m --n 200 --k 10 --positions 1,5,10 --prompt-style short \
    --max-new-tokens 16 --stop-at-line-end --batch-size 4 --max-words 100 --methods "$3" --no-progress \
    --out "$OUT/$1-$2" "${@:4}" || exit 1
}
for D in squad hotpotqa; do sweep $D a baseline,attn-calibration,ms-poe,finetuned; done
sweep squad c mudaf,moice,pos2distill,channel-scaling,rope-scaling
sweep hotpotqa c rope-scaling
for D in squad hotpotqa; do sweep $D b channel-scaling,attention-buckets; done
