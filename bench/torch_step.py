#!/usr/bin/env python3
"""torch_step.py: one train step of shardc's native code against PyTorch's CPU eager step on the
same shapes and thread count (docs/benchmarks.md, "Against PyTorch"). Reports; never fails on a
figure. Needs Debian's python3-torch (run with /usr/bin/python3); installs nothing.

    /usr/bin/python3 bench/torch_step.py build/shardc

It prints issue 23's table: shardc's step with the programs as written (bf16 params) and with every
bf16 in them and in the stdlib they import (but the targets' tables) made f32 (a copy in a temporary directory, SHARDC_STDLIB
pointing at it), against PyTorch bf16 autocast and f32; then the GEMM engines' rates on the same
CPU (build/bench/bench_runtime --engines: OpenBLAS sgemm, oneDNN f32 and bf16 matmul, one thread),
and the load average before and after (the machine may be shared: compare within one run).

Cases: the MLP sample (batch 16 x seq 256, embed 512, hidden 2048: gelu(x @ w_in) @ w_out, MSE,
adam) and one LLaMA block (bench/native/llama_block.shard: RMSNorm, grouped-query causal attention
with 8 heads over 2 KV heads of 64, SwiGLU 1536; batch 4 x seq 256, embed 512; MSE, adam). The
params are bf16 with f32 master copies in shardc; PyTorch runs them as f32 params under CPU
autocast to bf16 (its mixed precision: bf16 matmuls, f32 master weights), and in plain f32. shardc
runs one device thread per thread (`--mesh 'h100[data: T, model: 1]'`, data parallel), each with one
OpenBLAS thread; PyTorch runs torch.set_num_threads(T)."""
import json
import os
import re
import shutil
import tempfile
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

STEPS = 5


def shardc_step(shardc, root, args, threads, env=None):
    out = subprocess.run([shardc, "run", *args, "--mesh", f"h100[data: {threads}, model: 1]", "--steps", str(STEPS),
                          "--format", "json"], cwd=root, capture_output=True, text=True, check=True, env=env).stdout
    j = json.loads(out)
    assert j["pass"], out
    return j["step_time_s"]


def adam_step(params, opt, loss_fn):
    opt.zero_grad(set_to_none=True)
    loss = loss_fn()
    loss.backward()
    opt.step()
    return loss


def time_steps(params, loss_fn, mixed):
    opt = torch.optim.Adam(params, lr=1e-3)
    def run():
        if mixed:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return adam_step(params, opt, loss_fn)
        return adam_step(params, opt, loss_fn)
    for _ in range(2):
        run()
    t0 = time.perf_counter()
    for _ in range(STEPS):
        run()
    return (time.perf_counter() - t0) / STEPS


def mlp_case():
    b, s, e, h = 16, 256, 512, 2048
    w_in = torch.randn(e, h) / e ** 0.5
    w_out = torch.randn(h, e) / h ** 0.5
    x = torch.randn(b, s, e)
    labels = torch.randn(b, s, e)
    params = [w_in.requires_grad_(), w_out.requires_grad_()]

    def loss_fn():
        y = F.gelu(x @ w_in) @ w_out
        return ((y.float() - labels) ** 2).mean()
    return params, loss_fn


def rmsnorm(x, scale):
    xf = x.float()
    return (xf * torch.rsqrt((xf * xf).mean(-1, keepdim=True) + 1e-5) * scale).to(x.dtype)


def llama_case():
    b, s, e, hid, heads, kv, hd = 4, 256, 512, 1536, 8, 2, 64
    g = heads // kv
    mk = lambda *shape: (torch.randn(*shape) / shape[0] ** 0.5).requires_grad_()
    wq, wk, wv, wo = mk(e, heads * hd), mk(e, kv * hd), mk(e, kv * hd), mk(heads * hd, e)
    wg, wu, wd = mk(e, hid), mk(e, hid), mk(hid, e)
    n1, n2 = torch.ones(e, requires_grad=True), torch.ones(e, requires_grad=True)
    x = torch.randn(b, s, e)
    labels = torch.randn(b, s, e)
    mask = torch.ones(s, s, dtype=torch.bool).triu(1)

    def loss_fn():
        a = rmsnorm(x, n1)
        q = (a @ wq).view(b, s, kv, g, hd)
        k = (a @ wk).view(b, s, kv, hd)
        v = (a @ wv).view(b, s, kv, hd)
        sc = torch.einsum("bqkgd,bskd->bkgqs", q, k) * hd ** -0.5
        p = torch.softmax(sc.masked_fill(mask, float("-inf")).float(), dim=-1).to(v.dtype)
        o = torch.einsum("bkgqs,bskd->bqkgd", p, v).reshape(b, s, heads * hd)
        h1 = x + o @ wo
        m = rmsnorm(h1, n2)
        y = h1 + (F.silu(m @ wg) * (m @ wu)) @ wd
        return ((y.float() - labels) ** 2).mean()
    return [wq, wk, wv, wo, wg, wu, wd, n1, n2], loss_fn


def f32_copy(root, tmp, files):
    """The files and the stdlib with every bf16 made f32, under tmp; the environment that imports it."""
    bf16 = re.compile(r"\bbf16\b")
    shutil.copytree(os.path.join(root, "stdlib"), os.path.join(tmp, "stdlib"))
    for dirpath, _, names in os.walk(tmp):
        for n in names:
            if n.endswith(".shard") and n != "targets.shard":  # the targets' flops tables keep their bf16 rows
                path = os.path.join(dirpath, n)
                with open(path) as f:
                    text = f.read()
                with open(path, "w") as f:
                    f.write(bf16.sub("f32", text))
    for rel in files:
        with open(os.path.join(root, rel)) as f:
            text = f.read()
        os.makedirs(os.path.dirname(os.path.join(tmp, rel)), exist_ok=True)
        with open(os.path.join(tmp, rel), "w") as f:
            f.write(bf16.sub("f32", text))
    return dict(os.environ, SHARDC_STDLIB=os.path.join(tmp, "stdlib"))


def load():
    return "load average %.2f %.2f %.2f" % os.getloadavg()


def main():
    shardc = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "build/shardc")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    cases = [("mlp train step", mlp_case, ["samples/mlp.shard", "-D", "batch=16", "-D", "seq=256", "-D", "embed=512",
                                          "-D", "hidden=2048", "--layout", "dp"]),
             ("llama block train step", llama_case, ["bench/native/llama_block.shard", "--layout", "dp"])]
    tmp = tempfile.mkdtemp(prefix="torch_step.")
    try:
        env32 = f32_copy(root, tmp, [c[2][0] for c in cases])
        print(f"torch_step: torch {torch.__version__}, {os.cpu_count()} cores; mean of {STEPS} steps after 2 warm-up; {load()}")
        print(f"  {'case':24} {'threads':>7} {'shardc bf16':>12} {'shardc f32':>11} {'torch bf16':>11} {'torch f32':>10}"
              f" {'torch bf16/shardc bf16':>23} {'torch f32/shardc f32':>21}")
        for name, make, args in cases:
            for threads in (1, 2):
                torch.set_num_threads(threads)
                torch.manual_seed(0)
                mixed = time_steps(*make(), mixed=True)
                torch.manual_seed(0)
                plain = time_steps(*make(), mixed=False)
                ours = shardc_step(shardc, root, args, threads)
                ours32 = shardc_step(shardc, tmp, args, threads, env32)
                print(f"  {name:24} {threads:>7} {ours * 1e3:9.1f} ms {ours32 * 1e3:8.1f} ms {mixed * 1e3:8.1f} ms {plain * 1e3:7.1f} ms"
                      f" {mixed / ours:22.2f}x {plain / ours32:20.2f}x", flush=True)
    finally:
        shutil.rmtree(tmp)
    print(f"torch_step: {load()}")
    bench = os.path.join(os.path.dirname(shardc), "bench", "bench_runtime")
    if os.path.exists(bench):
        print("torch_step: the GEMM engines on this CPU (bench_runtime --engines --shapes square)", flush=True)
        subprocess.run([bench, "--engines", "--shapes", "square"], check=True)
        print(f"torch_step: {load()}")


if __name__ == "__main__":
    main()
