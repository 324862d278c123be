#!/usr/bin/env bash
# Makes random-weight demo checkpoints models/demo-bert and models/demo-gpt2
# with `lensd mkmodel` (their config.json says so: "lensd_random_weights") when
# they are missing. Used by the container image build (Dockerfile), whose
# context leaves out the trained models; `make run` serves the trained ones
# (scripts/train-demo.sh, models/README.md) and does not call this.
set -eu
lensd=$1
cd "$(dirname "$0")/.."
[ -f models/demo-bert/config.json ] || "$lensd" mkmodel --arch bert --preset tiny --seed 1 --out models/demo-bert
[ -f models/demo-gpt2/config.json ] || "$lensd" mkmodel --arch gpt2 --preset tiny --seed 2 --out models/demo-gpt2
