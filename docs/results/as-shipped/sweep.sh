#!/usr/bin/env bash
# Whole answering configurations as every interface ships them, judged by the default rule on three corpora.
# Each system answers under the instruction, token budget and stop rule the interfaces use (litm, 48 new tokens;
# the metrics read the first line, so --stop-at-line-end only stops decoding where the scores stop reading), 10
# passages of <= 100 words, gold at 1/5/10, n = 200, the CPU's default dtype, one thread a process.
#   systems: baseline; the current default (finetuned; gemma3-270m: the baseline already);
#            baseline restacked by its own evidence, strongest first (training-free, no measured order), 1 and 2 rounds
#            (ROUNDS=2); SLOTS=read restacks into the slots each prompt's content-free pass draws most to instead,
#            SLOTS=last strongest into the last slot (nearest the question), then the one before
#            (each setting its own folders, e.g. CORPUS-slots-read-sN, CORPUS-rounds-2-sN; METHODS=baseline answers
#            the baseline alone beside it)
#   corpora: nq-open (the third corpus: built by eval/build_nq_mdqa.py, nothing here was trained or measured on it),
#            squad, hotpotqa
# Usage: bash docs/results/as-shipped/sweep.sh MODEL CORPUS SHARD (e.g. qwen2.5-coder-0.5b nq-open 0/2); run the
# two shards of a pair side by side, one per core, then `midlens eval merge OUT/..-s0 OUT/..-s1 --out OUT/..`.
# Rerunning the same command resumes it (a folder as it ships here, rows gzipped, resumes too). Rows land beside
# this script, DATA relative to the repository root: run it from there.
set -u
export OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1
HERE=$(dirname "$0")
OUT=${OUT:-$HERE}  # the committed folders: a run resumes where the last commit left it
MODEL=$1 CORPUS=$2 SHARD=$3
case $CORPUS in
  nq-open) DATA=$HERE/nq-open/nq-open-mdqa-10.jsonl.gz ;;
  *) DATA=$CORPUS ;;
esac
case $MODEL in
  gemma3-270m) DEFAULT_METHODS=baseline ;;
  *) DEFAULT_METHODS=baseline,finetuned ;;
esac
METHODS=${METHODS:-$DEFAULT_METHODS}
SLOTS=${SLOTS:-first}
ROUNDS=${ROUNDS:-1}
FOLDER=$CORPUS$([ "$SLOTS" = first ] || echo "-slots-$SLOTS")$([ "$ROUNDS" = 1 ] || echo "-rounds-$ROUNDS")
${PY:-python} -m midlens eval sweep --dataset "$DATA" --model "$MODEL" --n 200 --k 10 --positions 1,5,10 \
  --prompt-style litm --max-new-tokens 48 --stop-at-line-end --no-logprob --max-words 100 --methods "$METHODS" \
  --restack baseline --restack-slots "$SLOTS" --restack-methods baseline --restack-rounds "$ROUNDS" \
  --no-progress --shard "$SHARD" --out "$OUT/$MODEL/$FOLDER-s${SHARD%/*}" ${EXTRA:-}
