#!/bin/sh
# plan_search.sh BUILD: `shardc plan`'s search time on the published-scale programs (issue 20):
# LLaMA 3 405B on 16,384 H100s, LLaMA 3 70B on 512 H100s, GPT-3 175B on 1,024 A100s. Prints, per
# program, the strategies considered, pruned by the resident-state bound, estimated (the closed-form
# estimate, with its time per strategy) and simulated (the estimate's best), the programs checked
# and simulated, the wall time (the search's own clock), programs per second and the best candidate.
# Reported in docs/benchmarks.md.
set -e
B=${1:-build}/shardc
for spec in "samples/llama3_405b.shard" "samples/llama3_70b.shard" "samples/gpt3_175b.shard --devices 1024 --target a100"; do
  # shellcheck disable=SC2086
  $B plan $spec --format json 2>/dev/null | /usr/bin/python3 -c '
import json, sys
d = json.load(sys.stdin)
best = d["candidates"][0] if d["candidates"] else None
print("%s\n  %5d considered %4d pruned %5d estimated (%.2f us each) %4d simulated: %5d programs %6.2f s %6.0f programs/s\n  best %s, %s: %.3f s MFU %.1f%%" % (
    sys.argv[1], d["searched"], d["pruned"], d["estimated"], 1e6 * d["estimate_seconds"] / max(1, d["estimated"]),
    d["simulated"], d["evaluated"], d["seconds"], d["evaluated"] / d["seconds"],
    best["mesh"], best["strategy"], best["step_time_s"], 100 * best["mfu"]))' "$spec"
done
