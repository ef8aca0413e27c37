#!/usr/bin/env python3
"""numpy_check.py: an independent check of the native code's math with NumPy (issue 10).

Writes inputs and params as .npy files, runs `shardc run ... --load DIR --save DIR` (sharded on
a 4-device mesh, and compared there with one device), then recomputes the result here from the same
files and compares it with output.npy (and a train step's first loss with loss.npy).
Usage: numpy_check.py SHARDC SOURCE_DIR WORK_DIR. Exit 0 when every check passes."""
import math
import os
import subprocess
import sys

import numpy as np

shardc, src, work = sys.argv[1], sys.argv[2], sys.argv[3]
rng = np.random.default_rng(11)
failed = 0


def bf16(a):
    """Rounds float32 values to bfloat16 (nearest even) and back, as shardc stores bf16."""
    b = np.asarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    b = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) << 16
    return (b & 0xFFFFFFFF).astype(np.uint32).view(np.float32)


def save(d, name, a):
    np.save(os.path.join(d, name + ".npy"), np.asarray(a))


def run(name, args, d):
    cmd = [shardc, "run"] + args + ["--load", d, "--save", d]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0 or "PASS" not in p.stdout:
        print(f"FAIL numpy.{name}: shardc run exited {p.returncode}\n{p.stdout}{p.stderr}")
        return False
    return True


def compare(name, got, want, tol):
    global failed
    err = float(np.max(np.abs(got - want)) / max(float(np.max(np.abs(want))), 1e-30))
    if not err <= tol:
        failed += 1
        print(f"FAIL numpy.{name}: differs from NumPy by {err:.3g} relative to its largest value (tolerance {tol})")
    else:
        print(f"PASS numpy.{name} ({err:.2g} relative)")


erf = np.vectorize(math.erf)

# ---- the MLP sample: forward, bf16 storage (h = gelu(x @ w_in) @ w_out) ----
B, S, E, H = 4, 8, 32, 64
dims = ["-D", f"batch={B}", "-D", f"seq={S}", "-D", f"embed={E}", "-D", f"hidden={H}", "--mesh", "h100[data: 2, model: 2]"]
d = os.path.join(work, "mlp")
os.makedirs(d, exist_ok=True)
x = rng.uniform(-1, 1, (B, S, E)).astype(np.float32)
w_in = (rng.uniform(-1, 1, (E, H)) / math.sqrt(E)).astype(np.float32)
w_out = (rng.uniform(-1, 1, (H, E)) / math.sqrt(H)).astype(np.float32)
labels = rng.uniform(-1, 1, (B, S, E)).astype(np.float32)
for n, a in [("x", x), ("w_in", w_in), ("w_out", w_out), ("labels", labels)]:
    save(d, n, a)
xb, wib, wob = bf16(x), bf16(w_in), bf16(w_out)
h = bf16(np.einsum("bse,eh->bsh", xb, wib))
g = bf16(0.5 * h * (1 + erf(h / math.sqrt(2))))
y = bf16(np.einsum("bsh,he->bse", g, wob))
if run("mlp.forward", [os.path.join(src, "samples/mlp.shard"), "--entry", "mlp.forward"] + dims, d):
    compare("mlp.forward", np.load(os.path.join(d, "output.npy")), y, 2e-2)
# the train step's first loss: mean squared error against the labels, before any update
if run("mlp.train", [os.path.join(src, "samples/mlp.shard")] + dims, d):
    loss = float(np.mean((y.astype(np.float64) - bf16(labels)) ** 2))
    compare("mlp.train.loss", np.load(os.path.join(d, "loss.npy"))[:1], np.array([loss]), 1e-2)

# ---- causal multi-head attention, f32 ----
B, S, E, NH, HD = 2, 8, 16, 4, 4
d = os.path.join(work, "attn")
os.makedirs(d, exist_ok=True)
x = rng.uniform(-1, 1, (B, S, E)).astype(np.float32)
w = {n: (rng.uniform(-1, 1, (E, NH, HD)) / math.sqrt(E)).astype(np.float32) for n in ["wq", "wk", "wv"]}
wo = (rng.uniform(-1, 1, (NH, HD, E)) / math.sqrt(NH * HD)).astype(np.float32)
for n, a in list(w.items()) + [("wo", wo), ("x", x)]:
    save(d, n, a)
q, k, v = (np.einsum("bse,enh->bsnh", x.astype(np.float64), w[n].astype(np.float64)) for n in ["wq", "wk", "wv"])
s = np.einsum("bqnh,bknh->bnqk", q, k) * 0.5
s = np.where(np.triu(np.ones((S, S), dtype=bool), 1), -np.inf, s)
p = np.exp(s - s.max(-1, keepdims=True))
p /= p.sum(-1, keepdims=True)
o = np.einsum("bnqk,bknh->bqnh", p, v)
y = np.einsum("bqnh,nhe->bqe", o, wo.astype(np.float64))
if run("attn.forward", [os.path.join(src, "tests/unit/native/attn.shard"), "--entry", "attn.forward"], d):
    compare("attn.forward", np.load(os.path.join(d, "output.npy")), y, 1e-4)

# ---- a LLaMA decoder block, f32: RMSNorm, grouped-query causal attention, SwiGLU ----
B, S, E, F, NH, KV, HD = 2, 8, 16, 32, 4, 2, 4
G = NH // KV
d = os.path.join(work, "block")
os.makedirs(d, exist_ok=True)
P = {
    "n1": 1 + rng.uniform(-0.25, 0.25, E), "n2": 1 + rng.uniform(-0.25, 0.25, E),
    "wq": rng.uniform(-1, 1, (E, NH, HD)) / 4, "wk": rng.uniform(-1, 1, (E, KV, HD)) / 4,
    "wv": rng.uniform(-1, 1, (E, KV, HD)) / 4, "wo": rng.uniform(-1, 1, (NH, HD, E)) / 4,
    "wg": rng.uniform(-1, 1, (E, F)) / 4, "wu": rng.uniform(-1, 1, (E, F)) / 4, "wd": rng.uniform(-1, 1, (F, E)) / 6,
}
P = {n: a.astype(np.float32) for n, a in P.items()}
x = rng.uniform(-1, 1, (B, S, E)).astype(np.float32)
for n, a in list(P.items()) + [("x", x)]:
    save(d, n, a)
P = {n: a.astype(np.float64) for n, a in P.items()}
x64 = x.astype(np.float64)


def rms(t, scale):
    return t / np.sqrt(np.mean(t * t, -1, keepdims=True) + 1e-5) * scale


a = rms(x64, P["n1"])
q = np.einsum("bse,enh->bsnh", a, P["wq"]).reshape(B, S, KV, G, HD)  # heads -> (kv_heads, group)
k = np.einsum("bse,ekh->bskh", a, P["wk"])
v = np.einsum("bse,ekh->bskh", a, P["wv"])
s = np.einsum("bqkgh,bpkh->bkgqp", q, k) * 0.5
s = np.where(np.triu(np.ones((S, S), dtype=bool), 1), -np.inf, s)
p = np.exp(s - s.max(-1, keepdims=True))
p /= p.sum(-1, keepdims=True)
o = np.einsum("bkgqp,bpkh->bqkgh", p, v).reshape(B, S, NH, HD)
x2 = x64 + np.einsum("bsnh,nhe->bse", o, P["wo"])
bb = rms(x2, P["n2"])
gate = bb @ P["wg"]
y = x2 + ((gate / (1 + np.exp(-gate))) * (bb @ P["wu"])) @ P["wd"]
if run("block.forward", [os.path.join(src, "tests/unit/native/block.shard"), "--entry", "block.forward"], d):
    compare("block.forward", np.load(os.path.join(d, "output.npy")), y, 1e-4)

print(f"{'FAIL' if failed else 'PASS'}: numpy checks, {failed} failed")
sys.exit(1 if failed else 0)
