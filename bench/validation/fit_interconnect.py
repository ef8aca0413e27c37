#!/usr/bin/python3
"""fit_interconnect.py: the NVLink collective curves of stdlib/targets.shard, fitted to interconnect.csv.

Run from the repository root: /usr/bin/python3 bench/validation/fit_interconnect.py
It prints, for each curve, the fitted { max, half_bytes, small } and the fit's error (the
difference between the model's and the measured bus bandwidth, |model / measured - 1|) over the
points it was fitted to and over every point of the curve. docs/targets.md copies the table;
tests/unit/test_interconnect.c checks the stdlib targets against the same points.

The model is compiler/cost/cost.c's, for an AllReduce of V bytes within one node of n GPUs:
  t = 2 (n - 1) alpha + 2 V (n - 1) / (n W e(V)),   e(V) = max x V^k / (V^k + half_bytes^k)
  busbw = (V / t) x 2 (n - 1) / n             (nccl-tests' definition)
with alpha = the target's nvlink_latency (1 us), W = its nvlink_bw and k the curve's `shape` (NCCL
adds channels and chunk pipelining as messages grow, so the measured curves rise more slowly than
k = 1, the affine alpha-beta time, allows). `small` is left out (0): the measured small messages are
slower than the model, not faster. The fit minimises the sum of
squared log errors of busbw over the points of at least FIT_MIN bytes (the sizes a training step's
collectives have; below that the measured times are NCCL's launch and protocol latency, 20-45 us,
which a 1 us alpha per ring step does not model: the error there is printed, not hidden).
"""
import csv
import math
import os
import sys

FIT_MIN = 1 << 20  # 1 MiB

# curve id prefix -> (target, W one-way bytes/s, which stdlib key it fits)
CURVES = [
    ("azure_a100_ar_", "a100", 3.0e11, "collective_efficiency (ring AllReduce; AllGather/ReduceScatter assumed alike)"),
    ("azure_h100_ar_", "h100", 4.5e11, "all_reduce_efficiency (NVLS AllReduce)"),
    ("azure_h200_ar_", "h200", 4.5e11, "all_reduce_efficiency (NVLS AllReduce)"),
    ("azure_gb200_ar_", "b200", 9.0e11, "collective_efficiency (ring AllReduce of 4 GB200s, NVLink 5)"),
]
ALPHA = 1e-6


def model_busbw(v, n, w, mx, half, k):
    e = mx * v ** k / (v ** k + half ** k)
    t = 2 * (n - 1) * ALPHA + 2 * v * (n - 1) / (n * w * e)
    return v / t * 2 * (n - 1) / n


def sse(pts, n, w, mx, half, k):
    return sum(math.log(model_busbw(v, n, w, mx, half, k) / b) ** 2 for v, b in pts)


def fit(pts, n, w):
    """Grid search: max in steps of 0.005, half_bytes in tenths of a decade, shape in steps of 0.05."""
    best = None
    for mx in [x / 200 for x in range(100, 241)]:
        for e10 in range(50, 100):
            half = float("%.2g" % 10 ** (e10 / 10))
            for k in [x / 20 for x in range(8, 25)]:
                s = sse(pts, n, w, mx, half, k)
                if best is None or s < best[0]:
                    best = (s, mx, half, k)
    return best[1:]


def main():
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)))
    rows = list(csv.DictReader(open(os.path.join(root, "interconnect.csv"))))
    print("| curve | target | key | gpus | max | half_bytes | shape | points fitted (>= 1 MiB) | mean / worst error there | all points: mean / worst |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for prefix, target, w, key in CURVES:
        pts = [(float(r["message_bytes"]), float(r["busbw_GBps"]) * 1e9, int(r["gpus"]))
               for r in rows if r["id"].startswith(prefix)]
        n = pts[0][2]
        big = [(v, b) for v, b, _ in pts if v >= FIT_MIN]
        mx, half, k = fit(big, n, w)

        def errs(ps):
            return [abs(model_busbw(v, n, w, mx, half, k) / b - 1) for v, b in ps]
        eb, ea = errs(big), errs([(v, b) for v, b, _ in pts])
        print("| %s | %s | %s | %d | %.3f | %.2g | %.2f | %d | %.1f%% / %.1f%% | %.1f%% / %.1f%% |" % (
            prefix.rstrip("_"), target, key, n, mx, half, k, len(big), 100 * sum(eb) / len(eb), 100 * max(eb),
            100 * sum(ea) / len(ea), 100 * max(ea)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
