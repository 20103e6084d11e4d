#!/bin/bash
# Cold build (empty target dir; cargo's registry already holds the crates) of what the README's first command compiles:
# `cargo run --package xtask` and then `cargo build --workspace --lib --bins` (xtask/src/terse_binary.rs).
set -u
export XDG_RUNTIME_DIR=/tmp
unset CARGO_TARGET_DIR
# The repository measured: this checkout's (run from inside it), or REPO.
repo=${REPO:-$(git rev-parse --show-toplevel)}
mkdir -p /tmp/cold
for which in new old; do
  rev=$([ $which = new ] && echo "${NEW:-eb78e44}" || echo "${OLD:-4a2d585^}")
  git clone -q "$repo" /tmp/cold/$which && cd /tmp/cold/$which && git checkout -q $rev
  echo "== $which $(git log --oneline -1 | cut -c1-60) start $(date -u +%T)"
  s=$(date +%s)
  CARGO_TARGET_DIR=/tmp/cold/$which-target cargo build -q -p xtask 2>&1 | tail -3
  m=$(date +%s)
  CARGO_TARGET_DIR=/tmp/cold/$which-target cargo build -q --workspace --lib --bins 2>&1 | tail -3
  e=$(date +%s)
  echo "== $which xtask $((m-s)) s, workspace $((e-m)) s, total $((e-s)) s; crates compiled: $(ls /tmp/cold/$which-target/debug/.fingerprint | wc -l) fingerprints"
done
echo "== done $(date -u +%T)"
