#!/usr/bin/env bash
# The GPU figures of docs/results/gpu/README.md, in one command on a machine without this project installed:
# midlens laid out as its import name under /tmp/pkg, random weights of a packaged model's shape (speed depends on
# shapes only), the shape's tokenizer carried in TOKENIZER. Usage: run.sh SHAPE TOKENIZER OUT [STEPS]
# Steps, run in the order given: profile (evidence prefill), batch (bench batch), hostprofile (one batch of each
# engine under the profiler), alone (batched vs alone in bf16), evidence (bench evidence). PROFILE_ARGS: extra options
# of the profile step (profile_evidence.py), e.g. "--repeats 20 --earlier-probe OLD/probe.py".
# Results land in a work folder, packed into OUT/gpu.tgz after each step: what comes back is what finished.
set -euo pipefail
shape=$1 tokenizer=$2 out=$3 steps=${4:-profile,batch,hostprofile,alone,evidence}
dtype=${DTYPE:-bfloat16} device=${DEVICE:-cuda} tokens=${TOKENS:-2048,8192,32768}
work=$(mktemp -d)
rm -rf /tmp/pkg && mkdir -p /tmp/pkg/midlens && cp -r midlens/* /tmp/pkg/midlens/
for layer in core generators retrievers rag training demo eval serve; do cp -r "$layer" "/tmp/pkg/midlens/$layer"; done
export PYTHONPATH=/tmp/pkg${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
pack() { tar czf "$out/gpu.tgz.part" -C "$work" . && mv "$out/gpu.tgz.part" "$out/gpu.tgz"; }
model=/tmp/random-$shape
[ -d "$model" ] || python3 -c "from midlens.generators.models.random_models import save_random_model as s; s('$shape', '$model', '$tokenizer')"
python3 -c "import torch, transformers, sys; print('torch', torch.__version__, 'transformers', transformers.__version__, 'python', sys.version.split()[0], torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu')" | tee "$work/versions.txt"
here=docs/results/gpu
# One function per step, run in the order named.
step_profile() {
  python3 $here/profile_evidence.py "$model" --tokens "$tokens" --device "$device" --dtype "$dtype" --out "$work" ${PROFILE_ARGS:-} 2>&1 | tee "$work/profile.log"
}
step_batch() {
  python3 -m midlens bench batch --model "$model" --device "$device" --dtype "$dtype" --batch-sizes "${BATCH_SIZES:-1,8,32}" \
    --prompts "${PROMPTS:-32}" --repeats "${REPEATS:-2}" --json "$work/batch.json" 2>&1 | tee "$work/batch.txt"
}
step_hostprofile() {
  python3 $here/profile_batch.py "$model" --batch "${PROFILE_BATCH:-32}" --device "$device" --dtype "$dtype" --out "$work" 2>&1 | tail -40 | tee "$work/profile-batch.log"
}
step_alone() {
  python3 $here/batch_vs_alone.py "$model" --prompts 16 --batch 16 --device "$device" --dtype "$dtype" --json "$work/alone.json"
}
step_evidence() {
  python3 -m midlens bench evidence --model "$model" --tokens "$tokens" --device "$device" --dtype "$dtype" \
    --skip-eager --repeats 5 --memory-repeats 1 --json "$work/evidence.json" 2>&1 | tee "$work/evidence.txt"
}
for step in ${steps//,/ }; do
  "step_$step"
  pack
done
