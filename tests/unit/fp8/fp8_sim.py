#!/usr/bin/python3
"""fp8_sim.py SHARDC DIR: `sim` prices an FP8 contraction at the target's FP8 rate, and `check`
counts FP8 tensors at one byte an element, each against a formula written here.

The rates are hardware-and-costs.md's (dense, per device): h100 and h200 FP8 1.98e15 (bf16 9.9e14),
b200 4.5e15 (2.25e15); a100, tpu_v5e: no FP8 units, so an FP8 contraction runs at the bf16 rate
(3.12e14, 1.97e14) and sim warns once, at the contraction. With --ideal a contraction's time is
max(2 B E H / rate, bytes / HBM bandwidth); these shapes are compute-bound by far:
bytes = (B E + E H) + 2 B H = 302 MB, 90 us on an H100's 3.35e12 B/s, against 555 us of FLOPs."""
import json
import subprocess
import sys

shardc, d = sys.argv[1], sys.argv[2]
B, E, H = 4096, 8192, 16384
FLOPS = 2 * B * E * H
RATES = {"h100": (1.98e15, 9.9e14, True), "h200": (1.98e15, 9.9e14, True), "b200": (4.5e15, 2.25e15, True),
         "a100": (3.12e14, 3.12e14, False), "tpu_v5e": (1.97e14, 1.97e14, False)}
failed = 0


def fail(msg):
    global failed
    failed += 1
    print("FAIL", msg)


def sim(entry, target):
    p = subprocess.run([shardc, "sim", f"{d}/fp8_gemm.shard", "--entry", entry, "--mesh", f"{target}[data: 1]",
                        "--ideal", "--format", "json"], capture_output=True, text=True)
    if p.returncode != 0:
        fail(f"sim {entry} on {target}: exit {p.returncode}: {p.stderr}")
        return None
    return json.loads(p.stdout)


def line_time(r, line):
    return sum(x["time_s"] for x in r["slowest_lines"] if x["line"] == line)


for target, (fp8, bf16, has_fp8) in RATES.items():
    for entry, line, rate in (("m.forward", 9, fp8), ("m.mixed", 14, fp8), ("m.plain", 17, bf16)):
        r = sim(entry, target)
        if r is None:
            continue
        want = FLOPS / rate
        got = line_time(r, line)
        if abs(got - want) > 1e-9 * want:
            fail(f"{target} {entry}: the contraction at line {line} takes {got:.9g} s, want 2 B E H / {rate:g} = {want:.9g} s")
        else:
            print(f"ok {target} {entry}: {got:.6g} s = {FLOPS:.4g} FLOPs / {rate:g}")
        warned = [w for w in r["warnings"] if "has no FP8 units" in w["message"]]
        fp8_entry = entry != "m.plain"
        if fp8_entry and not has_fp8 and not (len(warned) == 1 and warned[0]["line"] == line):
            fail(f"{target} {entry}: want one 'no FP8 units' warning at line {line}, got {r['warnings']}")
        if (has_fp8 or not fp8_entry) and warned:
            fail(f"{target} {entry}: a 'no FP8 units' warning where it does not apply: {warned}")

# check's memory: FP8 params at 1 byte an element (fp8_mem.shard: w1 f8e4m3[1024, 4096], w2 f8e5m2[4096, 1024])
p = subprocess.run([shardc, "check", f"{d}/fp8_mem.shard", "--mesh", "h100[data: 1]", "--format", "json"],
                   capture_output=True, text=True)
if p.returncode != 0:
    fail(f"check fp8_mem.shard: exit {p.returncode}: {p.stderr}")
else:
    r = json.loads(p.stdout)
    E2, H2, B2 = 1024, 4096, 64
    if r["params"]["bytes"] != 2 * E2 * H2 or r["memory"]["per_device"]["params"] != 2 * E2 * H2:
        fail(f"params {r['params']}, per device {r['memory']['per_device']['params']}: want 2 x {E2} x {H2} x 1 byte")
    # the peak: the f8e4m3 copy of w2 (E2 H2 bytes), h bf16[batch, hidden] and the bf16 result
    want_tmp = E2 * H2 * 1 + B2 * H2 * 2 + B2 * E2 * 2
    if r["memory"]["per_device"]["temporaries"] != want_tmp:
        fail(f"temporaries {r['memory']['per_device']['temporaries']}, want {want_tmp}")
    for x in r["largest"]:
        if x["dtype"].startswith("f8") and x["bytes"] != E2 * H2:
            fail(f"{x['what']}: {x['bytes']} bytes, want {E2 * H2}")
    print("ok check: FP8 params and temporaries at one byte an element")

print(f"{'FAIL' if failed else 'PASS'} fp8_sim ({failed} failed)")
sys.exit(1 if failed else 0)
