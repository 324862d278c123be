#!/usr/bin/env bash
# A lensd dataset job on Slurm: an array of N shards, then the merge once
# every shard has succeeded (docs/operations.md, "Sharded jobs").
#
#   deploy/slurm/lensd-job.sh KIND MODEL_DIR PARAMS.json N PARTS_DIR [DATA_DIR]
#
# Each array task runs `lensd job run --shards N` with SLURM_ARRAY_TASK_ID as
# its index; the merge job depends on the whole array (afterok) and writes
# PARTS_DIR/result.json. LENSD (default: lensd on PATH) and THREADS (default
# 2, the cores each task asks for) come from the environment; extra sbatch
# options (partition, account, time) from SBATCH_* variables as usual.
set -euo pipefail
if [ $# -lt 5 ]; then
  sed -n '2,13p' "$0" >&2
  exit 2
fi
kind=$1 model=$2 params=$3 shards=$4 parts=$5 data=${6:-.}
lensd=${LENSD:-lensd} threads=${THREADS:-2}
mkdir -p "$parts"
array=$(sbatch --parsable --job-name="lensd-$kind" --array="0-$((shards - 1))" --cpus-per-task="$threads" \
  --output="$parts/shard-%a.log" \
  --wrap="exec $lensd job run --kind $kind --model $model --params $params --data-dir $data --shards $shards --threads $threads --out $parts/part-{index}.lpart")
sbatch --parsable --job-name="lensd-$kind-merge" --dependency="afterok:$array" --cpus-per-task="$threads" \
  --output="$parts/merge.log" \
  --wrap="exec $lensd job merge --model $model --data-dir $data --threads $threads --out $parts/result.json $parts/part-*.lpart"
