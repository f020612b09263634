#!/usr/bin/env bash
# Klear's math RL stage on verl 0.9.1 + Ray with GPPO / GPPO+ERC / DAPO+ERC from klear_lib (docs/scale.md): the
# actor loss pg_loss + α·positive_loss, and Klear's group filter through verl's own dynamic sampling.
#
# Environment: its own venv, `pip install -r locks/verl-py312.txt && pip install --no-deps -e .` (docs/scale.md,
# "Environments": verl 0.9.1 needs transformers < 5.11 and hydra, whose antlr 4.9 clashes with this project's
# default math-verify build; the lock holds TransferQueue, the store of verl 0.9.1's default V1 trainer, which this
# script uses because only it filters groups). Multi-node: on every node, export the two
# KLEAR/VERL variables below before `ray start --head` (head) / `ray start --address=<head ip>:6379` (workers), so
# every Ray worker imports klear_lib.integrations.verl; then run this script on the head node.
#
# Usage: SFT_MODEL=/path/to/sft NNODES=2 GPUS_PER_NODE=8 scripts/verl_klear.sh [more hydra overrides]
#   One GPU: SFT_MODEL=/path/to/small/sft scripts/verl_klear.sh (NNODES=1; GPUS_PER_NODE defaults to the GPUs this
#   node has: CUDA_VISIBLE_DEVICES, else `nvidia-smi -L`);
#   ROLLOUT_TP: vLLM's tensor-parallel size, at most (default 2, 1 on one GPU); the script uses the largest divisor
#   of GPUS_PER_NODE not above it (1 GPU -> 1, 3 -> 1, 8 -> 2) and refuses a TP above GPUS_PER_NODE or a
#   GPUS_PER_NODE above the GPUs present;
#   DRY_RUN=1: print verl's command line, one argument a line, and run nothing (no data conversion either);
#   LOSS=gppo_erc (default) | gppo | ppo_clip_erc;
#   KLEAR_VERL_LOSS='{"erc_low": 0.8, "erc_high": 1.2, "sft_alpha": 0.1}' (JSON; sft_alpha is α, 0 turns it off);
#   FILTER=klear (default: keep a group iff its fully-correct indicator varies) | dapo (iff its rewards vary) | off;
#   DATA=Kwai-Klear/KlearReasoner-MathSub-30K (hub name or local json/parquet); DATA_DIR=data/klear.
# Not yet run by the project (no GPU was lent); the losses, the hooks, the reward dict, verl's group filter on our
# reward keys and every override key below are tested on CPU against verl 0.9.1 (tests/test_verl.py).
set -euo pipefail
: "${SFT_MODEL:?set SFT_MODEL to the long-CoT SFT checkpoint RL starts from}"
NNODES=${NNODES:-1}
DRY_RUN=${DRY_RUN:-0}
# The GPUs this node has: CUDA_VISIBLE_DEVICES when set, else nvidia-smi's list (0 where neither answers).
if [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then
  PRESENT=$(tr ',' '\n' <<<"$CUDA_VISIBLE_DEVICES" | grep -c .)
else
  PRESENT=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
fi
PRESENT=${PRESENT:-0}
GPUS_PER_NODE=${GPUS_PER_NODE:-$PRESENT}
if ! [ "$GPUS_PER_NODE" -ge 1 ] 2>/dev/null; then
  echo "verl_klear.sh: found no GPU on this node (CUDA_VISIBLE_DEVICES, nvidia-smi -L): set GPUS_PER_NODE" >&2; exit 2
fi
if [ "$PRESENT" -ge 1 ] && [ "$GPUS_PER_NODE" -gt "$PRESENT" ]; then
  echo "verl_klear.sh: GPUS_PER_NODE=$GPUS_PER_NODE but this node has $PRESENT GPU(s)" >&2; exit 2
fi
ROLLOUT_TP=${ROLLOUT_TP:-$((GPUS_PER_NODE < 2 ? GPUS_PER_NODE : 2))}
if ! [ "$ROLLOUT_TP" -ge 1 ] 2>/dev/null || [ "$ROLLOUT_TP" -gt "$GPUS_PER_NODE" ]; then
  echo "verl_klear.sh: ROLLOUT_TP=$ROLLOUT_TP must be between 1 and GPUS_PER_NODE=$GPUS_PER_NODE" >&2; exit 2
fi
TP=$ROLLOUT_TP  # the largest divisor of GPUS_PER_NODE not above ROLLOUT_TP: vLLM's replicas tile the node's GPUs
while [ $((GPUS_PER_NODE % TP)) -ne 0 ]; do TP=$((TP - 1)); done
LOSS=${LOSS:-gppo_erc}
FILTER=${FILTER:-klear}
DATA=${DATA:-Kwai-Klear/KlearReasoner-MathSub-30K}
DATA_DIR=${DATA_DIR:-data/klear}
PY=${PY:-python}
export VERL_USE_EXTERNAL_MODULES=${VERL_USE_EXTERNAL_MODULES:-klear_lib.integrations.verl}
export KLEAR_VERL_LOSS=${KLEAR_VERL_LOSS:-'{"erc_low": 0.8, "erc_high": 1.2, "sft_alpha": 0.1}'}

# Dynamic sampling (docs/scale.md): verl's algorithm.filter_groups on a key of verl_reward.compute_score's dict
# (acc: 1 iff the reward is the full score -> Klear's rule; score -> DAPO's). verl 0.9.1 starts each step with
# train_batch_size prompts and generates 2 more for every group it drops, at most max_inflight_gen_batches x
# train_batch_size prompts in flight (2 x 128), until train_batch_size groups are kept: it always trains on exactly
# 128 groups, ignores max_num_gen_batches and sets data.gen_batch_size to 1 itself. Klear's own run drew 256 prompts
# once per step (gen_batch_size 256, max_num_gen_batches 1): same rule and target, a different draw.
case "$FILTER" in
  klear) FILTER_ARGS=(algorithm.filter_groups.enable=True algorithm.filter_groups.metric=acc
                      algorithm.filter_groups.max_inflight_gen_batches=2) ;;
  dapo)  FILTER_ARGS=(algorithm.filter_groups.enable=True algorithm.filter_groups.metric=score
                      algorithm.filter_groups.max_inflight_gen_batches=2) ;;
  off)   FILTER_ARGS=(algorithm.filter_groups.enable=False) ;;
  *) echo "FILTER must be klear, dapo or off, got '$FILTER'" >&2; exit 2 ;;
esac

# verl reads parquet: Klear's RL records are already in verl's layout (data_source, prompt, ability, reward_model).
TRAIN="$DATA_DIR/train.parquet"
if [ ! -f "$TRAIN" ] && [ "$DRY_RUN" != 1 ]; then
  mkdir -p "$DATA_DIR"
  "$PY" - "$DATA" "$TRAIN" <<'PYPREP'
import sys
from datasets import load_dataset
src, out = sys.argv[1], sys.argv[2]
kind = {"json": "json", "jsonl": "json", "parquet": "parquet"}.get(src.rsplit(".", 1)[-1])
ds = load_dataset(kind, data_files=src, split="train") if kind else load_dataset(src, split="train")
ds.to_parquet(out)
print(f"{len(ds)} records -> {out}")
PYPREP
fi
REWARD=$("$PY" -c 'import klear_lib.integrations.verl_reward as m; print(m.__file__)')
RUN=("$PY" -m verl.trainer.main_ppo)
if [ "$DRY_RUN" = 1 ]; then RUN=(printf '%s\n' "$PY" -m verl.trainer.main_ppo); fi

# Klear's recipe (reference §4): 128 prompts x 8 responses trained on per step, mini-batch 16 (8 optimizer steps),
# lr 1e-6 with 10 warm-up steps, weight decay 0.1, clip 0.2/0.28, dual-clip 10, token-mean, no KL, no entropy bonus,
# α 0.1, T 1.0, 32K responses.
"${RUN[@]}" \
  trainer.use_v1=True \
  trainer.v1.trainer_mode=sync \
  algorithm.adv_estimator=grpo \
  algorithm.use_kl_in_reward=False \
  "${FILTER_ARGS[@]}" \
  data.train_files="$TRAIN" \
  data.val_files="$TRAIN" \
  data.train_batch_size=128 \
  data.max_prompt_length=4096 \
  data.max_response_length=32768 \
  data.truncation=left \
  actor_rollout_ref.model.path="$SFT_MODEL" \
  actor_rollout_ref.model.enable_gradient_checkpointing=True \
  actor_rollout_ref.actor.optim.lr=1e-6 \
  actor_rollout_ref.actor.optim.lr_warmup_steps=10 \
  actor_rollout_ref.actor.optim.weight_decay=0.1 \
  actor_rollout_ref.actor.grad_clip=1.0 \
  actor_rollout_ref.actor.ppo_mini_batch_size=16 \
  actor_rollout_ref.actor.ppo_epochs=1 \
  actor_rollout_ref.actor.use_dynamic_bsz=True \
  actor_rollout_ref.actor.ppo_max_token_len_per_gpu=40960 \
  actor_rollout_ref.actor.clip_ratio_low=0.2 \
  actor_rollout_ref.actor.clip_ratio_high=0.28 \
  actor_rollout_ref.actor.clip_ratio_c=10.0 \
  actor_rollout_ref.actor.loss_agg_mode=token-mean \
  actor_rollout_ref.actor.policy_loss.loss_mode="$LOSS" \
  actor_rollout_ref.actor.calculate_entropy=True \
  actor_rollout_ref.actor.entropy_coeff=0 \
  actor_rollout_ref.actor.use_kl_loss=False \
  actor_rollout_ref.rollout.name=vllm \
  actor_rollout_ref.rollout.n=8 \
  actor_rollout_ref.rollout.temperature=1.0 \
  actor_rollout_ref.rollout.top_p=1.0 \
  actor_rollout_ref.rollout.tensor_model_parallel_size="$TP" \
  actor_rollout_ref.rollout.gpu_memory_utilization=0.7 \
  reward.custom_reward_function.path="$REWARD" \
  reward.custom_reward_function.name=compute_score \
  trainer.nnodes="$NNODES" \
  trainer.n_gpus_per_node="$GPUS_PER_NODE" \
  trainer.project_name=klear \
  trainer.experiment_name="klear-$LOSS-$FILTER" \
  trainer.logger='["console"]' \
  trainer.save_freq=50 \
  trainer.test_freq=-1 \
  trainer.val_before_train=False \
  "$@"
