#!/usr/bin/env bash
# Makes the demo checkpoints `make run` serves, in models/. Until lensd trains
# its own demo models (lensd train), these are random-weight checkpoints made
# with `lensd mkmodel`, and their config.json says so ("lensd_random_weights").
set -eu
lensd=$1
cd "$(dirname "$0")/.."
[ -f models/demo-bert/config.json ] || "$lensd" mkmodel --arch bert --preset tiny --seed 1 --out models/demo-bert
[ -f models/demo-gpt2/config.json ] || "$lensd" mkmodel --arch gpt2 --preset tiny --seed 2 --out models/demo-gpt2
