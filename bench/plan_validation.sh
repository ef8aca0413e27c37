#!/bin/sh
# plan_validation.sh BUILD: does `shardc plan` beat the configuration the published run used, as
# `shardc sim` rates both (issue 20)? For each end-to-end run of docs/validation.md whose program is
# in bench/validation/ (its first mesh and layout are the published configuration), prints the
# published configuration's simulated step (`shardc sim`), the plan's best on the same devices and
# target (`shardc plan`, which defaults to the first mesh's), its mesh and layout, and
# published / plan. Reported in docs/benchmarks.md ("shardc plan against the published runs").
B=${1:-build}/shardc
for p in megatron_gpt_1.7b megatron_gpt_7.5b megatron_gpt_18.4b megatron_gpt_145.6b megatron_gpt_310.1b \
         megatron_gpt_529.6b megatron_gpt_1008b palm_540b korthikanti_gpt_22b korthikanti_gpt_175b \
         korthikanti_gpt_530b korthikanti_gpt_1t; do
  f=bench/validation/$p.shard
  sim=$($B sim "$f" --format json 2>/dev/null)
  plan=$($B plan "$f" --top 1 --format json 2>/dev/null)
  /usr/bin/python3 -c '
import json, sys
name, sim, plan = sys.argv[1], sys.argv[2], sys.argv[3]
try:
    s = json.loads(sim)["step_time_s"]
except Exception:
    s = None
try:
    c = json.loads(plan)["candidates"][0]
except Exception:
    c = None
if c is None or s is None:
    print("| %s | %s | no plan | | |" % (name, "%.4g s" % s if s else "no sim"))
else:
    lay = " ".join(c["layout"].split())
    print("| %s | %.4g s | %.4g s%s | `%s`, `%s` | %.3f |" % (name, s, c["step_time_s"], "" if c["fits"] else " (does not fit)",
          c["mesh"], lay, s / c["step_time_s"]))' "$p" "$sim" "$plan"
done
