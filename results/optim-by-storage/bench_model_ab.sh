#!/bin/bash
# Alternates the session-start (0d63321) and the current model_step bench, 3 runs each.
for i in 1 2 3; do
  for which in base head; do
    /tmp/model_step-$which --presets mini,base,resnet20 --batch 8 --seq 128 --precision fp32 2>/dev/null | grep '^{' | sed "s/^{/{\"build\": \"$which\", \"run\": $i, /"
  done
done
