#!/usr/bin/env bash
# Metadata-heavy workload (directories, creates, renames, unlinks) with syncs
# in between: on ext4 without a journal, crash images between syncs break.
set -eu
for round in 1 2 3; do
  mkdir -p "d$round"
  for i in $(seq 1 60); do echo "$round $i" > "d$round/f$i"; done
  for i in $(seq 1 20); do mv "d$round/f$i" "d$round/r$i"; done
  for i in $(seq 21 40); do rm "d$round/f$i"; done
  mkdir -p "d$round/sub/deeper"
  mv "d$round/f41" "d$round/sub/deeper/moved"
  sync
done
