#!/usr/bin/python3
"""plan_test.py: `shardc plan` as a capacity engineer uses it (issue 20).

  plan_test.py SHARDC ROOT CASE

CASE is one of:
  tree         the book's decision tree, a program per row, and the plan follows it: a 1B model on
               one 8-GPU node is data parallel alone (the batch over every device; plain, ZeRO-1 or
               FSDP: no tensor, pipeline, context or expert axis); 70B with adam on two nodes uses
               tensor parallelism or FSDP; 70B on 64 nodes keeps tensor parallelism inside a node
               (every candidate's `model` axis at most the target's 8 GPUs of NVLink); LLaMA 3 8B
               at sequence 131072 uses context parallelism (a `ctx` axis); Mixtral 8x7B with 2,048
               tokens a chip uses expert parallelism (an `ep` axis, `expert: ep`)
  paste        the best candidate's texts pasted into the program (its train block replaced, the
               mesh and layout appended) give, by `shardc sim` and `shardc check`, the step time,
               MFU and memory the plan printed, to the last bit
  samples      the best plan is never slower (by `shardc sim`) than any layout the program itself
               declares that fits, on the program's own mesh (the same devices)
  brute        on a small space (the 1B program on 8 devices), every strategy the plan's space holds
               written out here independently (mesh, layout, step: 256 with interleaved schedules and
               tp_overlap off), simulated one by one with `shardc sim`: the fastest that fits is the
               plan's first, though the plan simulates only the strategies its estimate ranks best
  estimate     the fast estimate ranks like the simulation: of the candidates simulated, the fastest is
               among the estimate's first 5 (the 1B program on 8 GPUs, LLaMA 3 70B on 512)
  determinism  the same input gives the same ranking, twice
  errors       a program with no train step: exit 1, located at its function; an unknown --target:
               exit 2 naming it; devices the dims cannot split: exit 1 saying so
Exit 1 on the first failure, with what differs.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

SHARDC, ROOT, CASE = sys.argv[1], sys.argv[2], sys.argv[3]


def fail(msg):
    print("FAIL " + msg)
    sys.exit(1)


def shardc(*args, ok=(0, 1)):
    r = subprocess.run([SHARDC] + list(args), capture_output=True, text=True, timeout=600)
    if r.returncode not in ok:
        fail("shardc %s: exit %d\n%s" % (" ".join(args), r.returncode, r.stderr[-2000:]))
    return r


def plan(path, *extra):
    r = shardc("plan", path, "--format", "json", *extra)
    try:
        return json.loads(r.stdout)
    except ValueError:
        fail("plan %s: not JSON: %s" % (path, r.stdout[:500]))


def mesh_axes(mesh):
    """'h100[stage: 2, data: 64, model: 4]' -> {'stage': 2, 'data': 64, 'model': 4} (in order)."""
    inner = mesh[mesh.index("[") + 1:mesh.rindex("]")]
    out = {}
    for part in inner.split(","):
        k, v = part.split(":")
        out[k.strip()] = int(v)
    return out


def pasted(path, cand):
    """The program with the candidate's texts pasted in, as a user would."""
    src = open(path).read()
    lines = src.split("\n")
    start = next(i for i, l in enumerate(lines) if l.startswith("train "))
    end = next(i for i in range(start + 1, len(lines)) if lines[i].strip().startswith("}"))
    out = "\n".join(lines[:start]) + "\n" + cand["step"] + "\n" + "\n".join(lines[end + 1:])
    out += "\nmesh planned = %s\n\n%s\n" % (cand["mesh"], cand["layout"])
    return out


SCRATCH = tempfile.mkdtemp(prefix="plan_test.")  # not beside the program: suite.plan reads tests/plan/*.shard


def write_beside(path, text, name):
    """The pasted program, in a scratch directory (the programs here import the stdlib alone)."""
    p = os.path.join(SCRATCH, name)
    with open(p, "w") as f:
        f.write(text)
    return p


def sim_json(path, *extra):
    r = shardc("sim", path, "--format", "json", *extra)
    return json.loads(r.stdout)


PLAN = os.path.join(ROOT, "tests", "plan")
SAMPLES = os.path.join(ROOT, "samples")


def case_tree():
    j = plan(os.path.join(PLAN, "llama_1b_node.shard"))
    best = j["candidates"][0]
    ax = mesh_axes(best["mesh"])
    if not best["fits"] or set(ax) - {"data", "fsdp"} or "seq:" in best["layout"]:
        fail("1B on one node: want data parallelism alone, got %s\n%s" % (best["mesh"], best["layout"]))
    j = plan(os.path.join(PLAN, "llama70b_two_nodes.shard"))
    best = j["candidates"][0]
    ax = mesh_axes(best["mesh"])
    if not best["fits"] or not (ax.get("model", 1) > 1 or "embed:" in best["layout"]):
        fail("70B on two nodes: want tensor parallelism or FSDP, got %s\n%s" % (best["mesh"], best["layout"]))
    j = plan(os.path.join(PLAN, "llama70b_64_nodes.shard"), "--top", "50")
    for c in j["candidates"]:
        ax = mesh_axes(c["mesh"])
        if ax.get("model", 1) > 8 or (ax.get("model", 1) > 1 and list(ax)[-1] != "model"):
            fail("70B on 64 nodes: tensor parallelism outside a node: %s" % c["mesh"])
    if not j["candidates"][0]["fits"] or mesh_axes(j["candidates"][0]["mesh"]).get("model", 1) < 2:
        fail("70B on 64 nodes: want tensor parallelism, got %s" % j["candidates"][0]["mesh"])
    j = plan(os.path.join(SAMPLES, "llama3_8b_long.shard"))
    best = j["candidates"][0]
    if not best["fits"] or mesh_axes(best["mesh"]).get("ctx", 1) < 2 or "seq: ctx" not in best["layout"]:
        fail("8B at 131072: want context parallelism, got %s\n%s" % (best["mesh"], best["layout"]))
    # Mixtral 8x7B with 2,048 tokens a chip: FSDP's gathers of all 8 experts' weights cannot hide
    # behind so little compute (tests/plan/mixtral_v5p_512.shard derives it); expert parallelism,
    # one expert a chip and AllToAlls of the slots, wins. (At the sample's 8,192 tokens a chip the
    # gathers hide and FSDP alone is fastest: docs/plan.md, "Mixtral".)
    j = plan(os.path.join(PLAN, "mixtral_v5p_512.shard"), "--devices", "512", "--target", "tpu_v5p")
    best = j["candidates"][0]
    if not best["fits"] or mesh_axes(best["mesh"]).get("ep", 1) < 2 or "expert: ep" not in best["layout"]:
        fail("Mixtral with 2,048 tokens a chip: want expert parallelism, got %s\n%s" % (best["mesh"], best["layout"]))
    print("PASS the decision tree's rows")


def case_paste():
    for path in (os.path.join(PLAN, "llama70b_two_nodes.shard"), os.path.join(SAMPLES, "llama3_70b.shard")):
        j = plan(path)
        best = j["candidates"][0]
        p = write_beside(path, pasted(path, best), "plan_test_pasted.shard")
        try:
            s = sim_json(p, "--mesh", "planned", "--layout", "plan")
            c = json.loads(shardc("check", p, "--mesh", "planned", "--layout", "plan", "--format", "json").stdout)
        finally:
            os.unlink(p)
        if s["step_time_s"] != best["step_time_s"] or s["mfu"] != best["mfu"]:
            fail("%s: pasted, sim gives %r s MFU %r; plan printed %r s MFU %r" % (
                path, s["step_time_s"], s["mfu"], best["step_time_s"], best["mfu"]))
        if c["memory"]["per_device"]["total"] != best["memory_per_device"] or c["memory"]["fits"] != best["fits"]:
            fail("%s: pasted, check gives %r B (fits %r); plan printed %r (fits %r)" % (
                path, c["memory"]["per_device"]["total"], c["memory"]["fits"], best["memory_per_device"], best["fits"]))
    print("PASS pasted texts reproduce the figures")


def layouts_of(path):
    return [l.split()[1] for l in open(path) if l.startswith("layout ")]


def case_samples():
    for name in ("llama3_70b.shard", "llama3_8b.shard", "llama2_13b.shard"):
        path = os.path.join(SAMPLES, name)
        best = plan(path)["candidates"][0]
        if not best["fits"]:
            fail("%s: no plan fits" % name)
        for lay in layouts_of(path):
            s = sim_json(path, "--layout", lay)
            if s.get("fits") and s["step_time_s"] < best["step_time_s"]:
                fail("%s: layout %s simulates %r s, faster than the plan's %r s" % (name, lay, s["step_time_s"], best["step_time_s"]))
    print("PASS the plan is never slower than the samples' own layouts")


def case_brute():
    """The plan's space for the 1B program on 8 H100s, written out independently: 256 strategies
    (with interleaved(2)/(4) schedules and tp_overlap off), of which the plan simulates only the 100
    its estimate ranks best. Per strategy, remat none, then selective, then full until one fits (a
    costlier remat of a strategy that fits at a cheaper one is never faster: it only adds compute)."""
    path = os.path.join(PLAN, "llama_1b_node.shard")
    batch, layers, heads, kv, hidden, vocab, seq, embed = 64, 16, 32, 8, 8192, 32000, 2048, 2048
    best = None
    tried = strategies = 0
    for t in (1, 2, 4, 8):
        for p in (1, 2, 4, 8):
            if 8 % (t * p) or layers % p:
                continue
            d = 8 // (t * p)
            R = batch // d                                    # rows a data rank holds
            micros, prev = [], 0
            for w in ((2 * p, 4 * p, 8 * p, R) if p > 1 else (1,)):
                m = w
                while m <= R and R % m:
                    m += 1
                if m > R or m <= prev:
                    continue
                micros.append(m)
                prev = m
            for fsdp in ((0, d) if d > 1 else (0,)):          # HSDP needs groups of 8 or more: none here
                for sp in ((0, 1) if t > 1 else (0,)):
                    for tp_off in ((0, 1) if t > 1 else (0,)):
                        for m in micros:
                            for V in ((1, 2, 4) if p > 1 else (1,)):
                                if V > 1 and ((layers // p) % V or m % p):   # Megatron-LM's interleaving condition
                                    continue
                                strategies += 1
                                for remat in ("none", "selective", "full"):
                                    axes = [(n, s) for n, s in (("stage", p), ("data", d), ("model", t)) if s > 1]
                                    mesh = "h100[%s]" % ", ".join("%s: %d" % a for a in axes) if axes else "h100[data: 1]"
                                    rules = []
                                    if d > 1:
                                        rules.append("batch: data")
                                    if fsdp:
                                        rules.append("embed: data")
                                    if p > 1:
                                        rules.append("layers: stage")
                                    if t > 1:
                                        rules += ["heads: model"] + (["kv_heads: model"] if kv % t == 0 else []) + \
                                                 ["hidden: model"] + (["vocab: model"] if vocab % t == 0 else [])
                                    if sp:
                                        rules.append("seq: model")
                                    layout = "layout plan {\n%s}" % "".join("  %s\n" % r for r in rules)
                                    sched = [] if p == 1 else ["schedule = interleaved(%d)" % V] if V > 1 else ["schedule = 1f1b"]
                                    keys = ["remat = %s" % remat] + (["microbatches = %d" % m] if m > 1 else []) + sched + \
                                           (["zero = 1"] if not fsdp and d > 1 else []) + (["tp_overlap = off"] if tp_off else [])
                                    step = "train llama.forward {\n  loss = cross_entropy\n  optimizer = adam\n  master = f32\n" \
                                           "  lr = 3e-4\n%s}" % "".join("  %s\n" % k for k in keys)
                                    text = pasted(path, {"step": step, "mesh": mesh, "layout": layout})
                                    f = write_beside(path, text, "plan_test_brute.shard")
                                    try:
                                        s = sim_json(f, "--mesh", "planned", "--layout", "plan")
                                    finally:
                                        os.unlink(f)
                                    tried += 1
                                    if "step_time_s" in s and s.get("fits"):
                                        if best is None or s["step_time_s"] < best[0]:
                                            best = (s["step_time_s"], mesh, layout, step)
                                        break
    j = plan(path)
    got = j["candidates"][0]
    if j["estimated"] != strategies:
        fail("the plan estimated %d strategies; the space written out here holds %d" % (j["estimated"], strategies))
    if not j["simulated"] < strategies:
        fail("the plan simulated %d of %d strategies: the estimate pruned nothing, so this tests nothing of it" % (
            j["simulated"], strategies))
    if best is None or got["step_time_s"] != best[0]:
        fail("brute force over %d programs: best %r s (%s)\n%s\nthe plan's first: %r s (%s)\n%s" % (
            tried, best and best[0], best and best[1], best and best[3], got["step_time_s"], got["mesh"], got["step"]))
    print("PASS the plan's first, simulating %d of %d strategies, is the fastest of %d programs tried one by one" % (
        j["simulated"], strategies, tried))


def case_estimate():
    """The estimate ranks like the simulation: among the candidates plan simulated (each carries its
    estimate), the one the simulation rates fastest is among the estimate's first 5."""
    for path, extra in ((os.path.join(PLAN, "llama_1b_node.shard"), ()), (os.path.join(SAMPLES, "llama3_70b.shard"), ())):
        j = plan(path, "--top", "1000", *extra)
        fit = [c for c in j["candidates"] if c["fits"]]
        if len(fit) < 10:
            fail("%s: %d candidates fit; too few to test a ranking" % (path, len(fit)))
        fastest = min(range(len(fit)), key=lambda i: (fit[i]["step_time_s"], i))
        by_estimate = sorted(range(len(fit)), key=lambda i: (fit[i]["estimate_s"], i))
        rank = by_estimate.index(fastest)
        if rank >= 5:
            fail("%s: the simulation's fastest (%s, %r s) is the estimate's %d. of %d" % (
                path, fit[fastest]["strategy"], fit[fastest]["step_time_s"], rank + 1, len(fit)))
        if not all(c["estimate_s"] > 0 for c in fit):
            fail("%s: a candidate without an estimate" % path)
    print("PASS the simulation's fastest is among the estimate's first 5")


def case_determinism():
    path = os.path.join(SAMPLES, "llama3_70b.shard")
    a = plan(path, "--top", "20")["candidates"]
    b = plan(path, "--top", "20")["candidates"]
    if a != b:
        fail("two runs rank differently")
    print("PASS the same ranking twice (%d candidates)" % len(a))


def case_errors():
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "fwd.shard")
        with open(p, "w") as f:
            f.write('import "targets"\nmesh m = h100[data: 2]\ndim batch = 8, embed = 16, hidden = 32\n'
                    'model lin {\n  param w: f32[embed, hidden]\n'
                    '  fn forward(x: f32[batch, embed]) -> f32[batch, hidden] {\n    return x @ w\n  }\n}\n')
        r = shardc("plan", p, ok=(1,))
        if "fwd.shard:6:6: error: plan searches layouts for a train step" not in r.stderr:
            fail("no train step: want a located error at the function, got:\n" + r.stderr)
    r = shardc("plan", os.path.join(PLAN, "llama_1b_node.shard"), "--target", "h10", ok=(2,))
    if "--target h10" not in r.stderr or "did you mean 'h100'" not in r.stderr:
        fail("unknown --target: want its name and a did-you-mean, got:\n" + r.stderr)
    r = shardc("plan", os.path.join(PLAN, "llama_1b_node.shard"), "--devices", "7", ok=(1,))
    if "no strategy: 7 devices" not in r.stdout:
        fail("7 devices for a batch of 64: want 'no strategy', got:\n" + r.stdout)
    print("PASS the errors")


try:
    {"tree": case_tree, "errors": case_errors, "paste": case_paste, "samples": case_samples, "brute": case_brute,
     "estimate": case_estimate, "determinism": case_determinism}[CASE]()
finally:
    shutil.rmtree(SCRATCH, ignore_errors=True)
