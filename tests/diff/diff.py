#!/usr/bin/python3
"""diff.py: the differential tester of `shardc run` (tests/diff/README.md).

Random cases -- a sample or a stdlib model at small sizes, a random mesh (1-3 axes of size 1, 2 or
4, 2-8 devices, an H100 or a TPU target), a random layout written as a `layout diffcase` block in a
generated copy of the program, random step keys (optimizer, lr, master, remat, microbatches, zero,
a pipeline's schedule) and bf16 or f32 (every bf16 of the model rewritten) -- each run through
`shardc run --steps 2 --timeout S`. A case must PASS, or be refused before it runs with a located
error (file:line:col) whose message is one of the documented limits (KNOWN_LIMITS, docs/run.md
"What the differential tester accepts as a refusal"). Anything else is a finding: FAIL, crash (a
signal, a sanitizer report, a device that failed), timeout, or a bad refusal (unlocated, or not a
documented limit). Each finding is saved (program, command, output) and shrunk to a smaller case
that fails the same way.

Cases are deterministic: case i of seed S is made from random.Random("S:i") alone, so
`--only i` reruns one. `--backend mpi` runs every case over the runtime's MPI backend (run
--backend mpi, one rank per device, or the hybrid past --max-ranks). Standard library only (Debian's /usr/bin/python3).
"""
import argparse
import concurrent.futures
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

# ---- the corpus: every sample and stdlib model, with the small sizes docs/run.md gives ----

LM = {"batch": 8, "seq": 16, "embed": 32, "hidden": 64, "heads": 4, "head": 8, "vocab": 64, "layers": 2,
      "kv_heads": 2}
GPT = {k: v for k, v in LM.items() if k != "kv_heads"}
LM_DIMS = ["batch", "seq", "kseq", "embed", "hidden", "heads", "kv_heads", "head", "vocab", "layers"]

CORPUS = {
    # name: file (relative to the repo), -D sizes, dims a layout may map, the model and its
    # function, the layouts the file declares (a case may use one of them instead of its own)
    "mlp": dict(file="samples/mlp.shard", sizes={"batch": 8, "seq": 8, "embed": 32, "hidden": 64},
                dims=["batch", "seq", "embed", "hidden"], model="mlp", entries=["forward"],
                layouts=["fsdp_tp", "dp", "fsdp", "tp"], weight=3),
    "llama3_8b": dict(file="samples/llama3_8b.shard", sizes=LM, dims=LM_DIMS, model="llama", entries=["forward"],
                      layouts=["fsdp_tp", "fsdp_tp_sp", "fsdp", "dp_tp", "dp"], weight=3),
    "llama2_13b": dict(file="samples/llama2_13b.shard", sizes=LM, dims=LM_DIMS, model="llama",
                       entries=["forward"], layouts=["fsdp_tp", "fsdp_tp_sp", "fsdp", "dp_tp", "dp"], weight=1),
    "llama3_70b": dict(file="samples/llama3_70b.shard", sizes=LM, dims=LM_DIMS, model="llama",
                       entries=["forward"], layouts=["fsdp_tp_sp", "fsdp_tp", "fsdp", "dp_tp", "dp"], weight=1),
    "llama3_405b": dict(file="samples/llama3_405b.shard", sizes=LM, dims=LM_DIMS, model="llama",
                        entries=["forward"], layouts=["fsdp_tp_sp", "fsdp_tp", "hsdp_tp_sp", "dp_tp"], weight=1),
    "llama3_405b_pp": dict(file="samples/llama3_405b_pp.shard", sizes=dict(LM, batch=16, layers=4), dims=LM_DIMS,
                           model="llama", entries=["forward"], layouts=["pp_tp_sp", "pp_tp", "pp_fsdp_tp_sp"],
                           weight=2),
    "llama3_8b_long": dict(file="samples/llama3_8b_long.shard", sizes=LM, dims=LM_DIMS, model="llama",
                           entries=["forward"], layouts=["fsdp_tp_cp"], weight=2),
    "gpt3_175b": dict(file="samples/gpt3_175b.shard", sizes=dict(GPT, batch=16, layers=4),
                      dims=["batch", "seq", "kseq", "embed", "hidden", "heads", "head", "vocab", "layers"],
                      model="gpt", entries=["forward"], layouts=["ptd", "ptd_sp", "ptd_fsdp"], weight=2),
    "mixtral_8x7b": dict(file="samples/mixtral_8x7b.shard", sizes=dict(LM, batch=8, expert=4, cap=4),
                         dims=LM_DIMS + ["expert", "cap"], model="mixtral", entries=["forward", "aux_loss"],
                         layouts=["dp_ep_tp", "dp_tp"], weight=3),
}

# stdlib/layers.shard's models, each in a small program of its own (a user's first program); the
# sizes are given with -D too, so that a saved case keeps them
STDLIB_SIZES = {"batch": 8, "seq": 16, "embed": 32, "hidden": 64, "heads": 4, "kv_heads": 2, "head": 8, "expert": 4,
                "cap": 4}
STDLIB_PROGRAM = """import "targets"
import "layers"

mesh m0 = h100[data: 2, model: 2]
dim batch = 8, seq = 16, kseq = seq, embed = 32, hidden = 64
dim heads = 4, kv_heads = 2, group = heads / kv_heads, head = 8, expert = 4, cap = 4

train {model}.forward {{
  loss = mse
  optimizer = adam
}}
"""
for _model, _dims, _entries in [
        ("gated_mlp", ["batch", "seq", "embed", "hidden"], ["forward"]),
        ("attention", ["batch", "seq", "kseq", "embed", "heads", "head"], ["forward"]),
        ("gqa_attention", ["batch", "seq", "kseq", "embed", "heads", "kv_heads", "head"], ["forward"]),
        ("transformer_block", ["batch", "seq", "kseq", "embed", "hidden", "heads", "kv_heads", "head"], ["forward"]),
        ("moe_mlp", ["batch", "seq", "embed", "hidden", "expert", "cap"], ["forward", "aux_loss"])]:
    CORPUS["stdlib." + _model] = dict(text=STDLIB_PROGRAM.format(model=_model), sizes=dict(STDLIB_SIZES), dims=_dims, model=_model,
                                      entries=_entries, layouts=[], weight=1)


def corpus_from_file(rel, weight=1):
    """A small program of its own (tests/models/: the stdlib models the Hugging Face import uses):
    its dims, layouts and train step read from the file."""
    with open(os.path.join(ROOT, rel)) as f:
        text = f.read()
    dims = []
    for line in re.findall(r"^dim\s+(.*)$", text, re.M):
        for decl in line.split("#")[0].split(","):
            m = re.match(r"\s*(\w+)\s*=", decl)
            if m and m.group(1) not in dims:
                dims.append(m.group(1))
    train = re.search(r"^train\s+(\w+)\.(\w+)", text, re.M)
    sizes = {}
    m = re.search(r"\bbatch\s*=\s*(\d+)", text)
    if m:
        sizes_batch = int(m.group(1))
    return dict(file=rel, sizes=sizes, dims=dims, model=train.group(1), entries=[train.group(2)],
                layouts=re.findall(r"^layout\s+(\w+)", text, re.M), weight=weight,
                batch=sizes_batch if m else 8)


for _path in sorted(os.listdir(os.path.join(ROOT, "tests", "models"))) if os.path.isdir(os.path.join(ROOT, "tests", "models")) else []:
    if _path.endswith(".shard"):
        CORPUS["models." + _path[:-6]] = corpus_from_file(os.path.join("tests", "models", _path), weight=0.5)

AXIS_NAMES = ["data", "model", "fsdp", "ep", "ctx", "stage", "x", "y"]
TARGETS = ["h100", "h100", "a100", "tpu_v5e", "tpu_v5p"]
LRS = ["1e-3", "3e-4", "1e-2", "0.1"]

# Refusals the tester accepts: a located error (file:line:col) whose message matches one of these,
# each a limit documented in docs/run.md ("What the differential tester accepts as a refusal").
# Keep the two lists the same.
KNOWN_LIMITS = [
    (r"microbatches = \d+ must divide the dim 'batch'|microbatches = \d+ does not divide dim 'batch'",
     "microbatches must divide batch"),
    (r"microbatches holds \d+ rows? of 'batch' \(\d+\), which do not divide over the axes that shard it",
     "a microbatch's rows must divide over batch's axes"),
    (r"param .* has the dim 'batch', which microbatches split", "microbatches split batch"),
    (r"does not fit", "does not fit"),
    (r"causal ring attention over .* splits \w+ \(\d+\) into 2 x \d+ chunks, which it does not divide",
     "a causal ring needs the sequence in 2n chunks"),
    (r"this split cannot keep the sharding of .* does not lay out evenly onto",
     "a dim sharded over one axis cannot be split into parts smaller than the axis"),
    (r"this pipeline cannot be split into stages: a loop other than the layers' read by several stages",
     "one stacked loop per pipeline"),
    (r"this pipeline cannot be split into stages: a microbatch body whose carried value is not an accumulation",
     "a pipeline's microbatch body carries accumulations only (zero = 2)"),
    (r"this pipeline cannot be split into stages: the layers carry more than the activation from one to the next",
     "pipelined layers carry one activation"),
]


def is_known_limit(msg):
    for pat, what in KNOWN_LIMITS:
        if re.search(pat, msg):
            return what
    return None


# ---- making a case ----

def divisors(n):
    return [d for d in range(1, n + 1) if n % d == 0]


def make_case(seed, index):
    """Case `index` of `seed`: a dict that render() turns into a program and a command."""
    rng = random.Random("%s:%s" % (seed, index))
    names = sorted(CORPUS)
    name = rng.choices(names, weights=[CORPUS[n]["weight"] for n in names])[0]
    c = CORPUS[name]
    case = {"id": "%s-%d" % (seed, index), "sample": name, "seed": rng.randrange(1, 1 << 30)}
    # the mesh: 1-3 axes of size 1, 2 or 4, 2 to 8 devices
    while True:
        naxes = rng.choice([1, 2, 2, 3, 3])
        sizes = [rng.choice([1, 2, 2, 4]) for _ in range(naxes)]
        devices = 1
        for s in sizes:
            devices *= s
        if 2 <= devices <= 8:
            break
    axes = rng.sample(AXIS_NAMES, naxes)
    case["target"] = rng.choice(TARGETS)
    case["mesh"] = [[a, s] for a, s in zip(axes, sizes)]
    sizes_of = dict(c["sizes"])
    # the layout: the file's own (a sixth of the time), else random rules over random dims
    if c["layouts"] and rng.random() < 1 / 6:
        case["layout"] = {"named": rng.choice(c["layouts"])}
        # the named layout's axes: give the mesh the names it uses, so that its rules apply
        used = layout_axes(c, case["layout"]["named"])
        names = rng.sample(used, min(naxes, len(used)))
        names += [a for a in AXIS_NAMES if a not in names][:naxes - len(names)]
        case["mesh"] = [[a, s] for a, s in zip(names, sizes)]
    else:
        nrules = rng.randint(1, min(5, len(c["dims"])))
        dims = rng.sample(c["dims"], nrules)
        rules = []
        for d in dims:
            k = 1 if naxes == 1 or rng.random() < 0.75 else 2
            rules.append([d, rng.sample(axes, k)])
        case["layout"] = rules
    # the entry: the train step mostly, else a function alone
    train = rng.random() < 0.75
    case["entry"] = "train" if train else rng.choice(c["entries"])
    if case["entry"] == "aux_loss" and not train:
        pass
    case["dtype"] = rng.choice(["bf16", "bf16", "f32"])
    keys = {}
    if train:
        keys["optimizer"] = rng.choice(["adam", "adam", "sgd"])
        keys["lr"] = rng.choice(LRS)
        if case["dtype"] == "bf16" and rng.random() < 0.5:
            keys["master"] = "f32"
        if "layers" in c["dims"] or name.startswith("stdlib.transformer"):
            keys["remat"] = rng.choice(["none", "full", "dots"])  # selective: not implemented (sema)
        else:
            keys["remat"] = rng.choice(["none", "none", "dots"])
        batch = sizes_of.get("batch", c.get("batch", 8))
        # each microbatch's rows must divide over the axes sharding batch (a user error otherwise)
        bp = batch_ways(case, c)
        keys["microbatches"] = rng.choice([m for m in divisors(batch) if m <= 4 and (batch // m) % bp == 0] + [1, 1])
        if rng.random() < 0.1 and keys["optimizer"] == "adam":
            keys["zero"] = rng.choice([1, 2])
        # a pipeline: layers mapped to an axis of size > 1 needs a schedule, microbatches
        stage = pipeline_axis(case)
        if stage:
            p = dict(case["mesh"])[stage]
            if sizes_of.get("layers", 2) < 2 * p:
                sizes_of["layers"] = 2 * p
            keys["schedule"] = rng.choice(["gpipe", "1f1b", "1f1b", "interleaved(2)"])
            keys["microbatches"] = rng.choice([m for m in divisors(batch) if p <= m <= 2 * p and (batch // m) % bp == 0]
                                              or [m for m in divisors(batch) if m >= p and (batch // m) % bp == 0] or [p])
    else:
        stage = pipeline_axis(case)
        if stage:
            p = dict(case["mesh"])[stage]
            if sizes_of.get("layers", 2) < 2 * p:
                sizes_of["layers"] = 2 * p
    case["keys"] = keys
    case["sizes"] = sizes_of
    case["steps"] = 2 if train else 1
    return case


def fresh(seen, rng):
    for a in AXIS_NAMES:
        if a not in seen:
            seen.add(a)
            return a
    raise ValueError("no axis name left")


def layout_axes(c, lname):
    text = program_source(c)
    m = re.search(r"layout\s+%s\s*\{([^}]*)\}" % re.escape(lname), text)
    if not m:
        return []
    out = []
    for a in re.findall(r"[:,(]\s*([A-Za-z_]\w*)", m.group(1)):
        if a not in out:
            out.append(a)
    return out


def layout_rules(case, c):
    """The case's layout as [dim, [axes]] rules (a named layout read from the file)."""
    if isinstance(case["layout"], list):
        return case["layout"]
    m = re.search(r"layout\s+%s\s*\{([^}]*)\}" % re.escape(case["layout"]["named"]), program_source(c))
    rules = []
    for line in m.group(1).splitlines():
        r = re.match(r"\s*(\w+)\s*:\s*\(?([\w,\s]+)\)?", line.split("#")[0])
        if r:
            rules.append([r.group(1), [a.strip() for a in r.group(2).split(",") if a.strip()]])
    return rules


def batch_ways(case, c):
    """How many ways the layout's rule for batch splits it on the case's mesh."""
    sizes = dict((a, s) for a, s in case["mesh"])
    for d, axes in layout_rules(case, c):
        if d == "batch":
            n = 1
            for a in axes:
                n *= sizes.get(a, 1)
            return n if all(a in sizes for a in axes) or len(axes) == 1 else 1
    return 1


def pipeline_axis(case):
    """The axis `layers` is mapped to, when that makes a pipeline (size > 1)."""
    sizes = dict((a, s) for a, s in case["mesh"])
    for d, axes in layout_rules(case, CORPUS[case["sample"]]):
        if d == "layers" and len(axes) == 1 and sizes.get(axes[0], 1) > 1:
            return axes[0]
    return None


# ---- rendering a case: the program, its stdlib, the command ----

_source_cache = {}


def program_source(c):
    key = c.get("file") or c["text"]
    if key not in _source_cache:
        if "file" in c:
            with open(os.path.join(ROOT, c["file"])) as f:
                _source_cache[key] = f.read()
        else:
            _source_cache[key] = c["text"]
    return _source_cache[key]


def to_f32(text):
    """Every bf16 of a model's source made f32 (types and casts); comments too, harmlessly."""
    return re.sub(r"\bbf16\b", "f32", text)


def stdlib_dir(work, dtype):
    """The stdlib the case imports: the repo's, or a copy whose models are f32 (targets unchanged)."""
    src = os.path.join(ROOT, "stdlib")
    if dtype != "f32":
        return src
    dst = os.path.join(work, "stdlib_f32")
    with _lock:
        if not os.path.isdir(dst):
            tmp = dst + ".tmp%d" % os.getpid()
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.copytree(src, tmp)
            for dirpath, _, files in os.walk(tmp):
                for fn in files:
                    if fn.endswith(".shard") and fn != "targets.shard":
                        p = os.path.join(dirpath, fn)
                        with open(p) as f:
                            t = f.read()
                        with open(p, "w") as f:
                            f.write(to_f32(t))
            os.rename(tmp, dst)
    return dst


_lock = threading.Lock()


def train_block(c, keys):
    text = program_source(c)
    m = re.search(r"^train\s+([\w.]+)\s*\{(.*?)^\}", text, re.S | re.M)
    loss = re.search(r"loss\s*=\s*(\w+)", m.group(2)).group(1)
    lines = ["train %s {" % m.group(1), "  loss = %s" % loss]
    for k in ["optimizer", "lr", "master", "remat", "microbatches", "schedule", "zero"]:
        if k in keys:
            lines.append("  %s = %s" % (k, keys[k]))
    lines.append("}")
    return m, "\n".join(lines)


def render(case):
    """(program text, argv after the file, the stdlib it needs: 'f32' or None)."""
    c = CORPUS[case["sample"]]
    text = program_source(c)
    # the step's keys (a function alone keeps a train block of its own keys: the file's could
    # name microbatches its small batch does not divide)
    m, block = train_block(c, case["keys"] if case["entry"] == "train" else {"optimizer": "sgd"})
    text = text[:m.start()] + block + text[m.end():]
    if case["dtype"] == "f32":
        text = to_f32(text)
    args = []
    if isinstance(case["layout"], dict):
        args += ["--layout", case["layout"]["named"]]
    else:
        text += "\n# the differential tester's layout (tests/diff/diff.py)\nlayout diffcase {\n"
        for d, axes in case["layout"]:
            text += "  %s: %s\n" % (d, axes[0] if len(axes) == 1 else "(" + ", ".join(axes) + ")")
        text += "}\n"
        args += ["--layout", "diffcase"]
    mesh = "%s[%s]" % (case["target"], ", ".join("%s: %d" % (a, s) for a, s in case["mesh"]))
    args += ["--mesh", mesh]
    for d, n in sorted(case["sizes"].items()):
        args += ["-D", "%s=%d" % (d, n)]
    if case["entry"] != "train":
        args += ["--entry", "%s.%s" % (c["model"], case["entry"])]
    args += ["--steps", str(case["steps"]), "--seed", str(case["seed"])]
    return text, args


def describe(case):
    lay = case["layout"]
    if isinstance(lay, dict):
        ltxt = "layout " + lay["named"]
    else:
        ltxt = "{" + ", ".join("%s: %s" % (d, a[0] if len(a) == 1 else "(" + ", ".join(a) + ")") for d, a in lay) + "}"
    mesh = "%s[%s]" % (case["target"], ", ".join("%s: %d" % (a, s) for a, s in case["mesh"]))
    keys = " ".join("%s=%s" % (k, v) for k, v in sorted(case["keys"].items()))
    return "%s %s %s %s %s %s" % (case["sample"], case["entry"], case["dtype"], mesh, ltxt, keys)


# ---- running a case and judging it ----

SANITIZER = re.compile(r"AddressSanitizer|LeakSanitizer|ThreadSanitizer|MemorySanitizer|runtime error:|UndefinedBehaviorSanitizer")


def run_case(case, opts, work):
    """Runs the case; returns (outcome, detail, record) with outcome one of PASS, refused, FAIL,
    crash, timeout, bad-refusal."""
    text, args = render(case)
    d = os.path.join(work, case["id"])
    os.makedirs(d, exist_ok=True)
    prog = os.path.join(d, "case.shard")
    with open(prog, "w") as f:
        f.write(text)
    env = dict(os.environ)
    env["SHARDC_STDLIB"] = stdlib_dir(work, case["dtype"])
    env.update(opts.env)
    argv = [opts.shardc, "run", prog] + args + ["--timeout", str(opts.coll_timeout), "--diag-format", "machine"]
    argv += backend_args(case, opts)
    t0 = time.time()
    try:
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=d,
                             start_new_session=True, text=True, errors="replace")
        try:
            out, err = p.communicate(timeout=opts.wall_timeout)
            rc = p.returncode
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            out, err = p.communicate()
            rc = None
    except OSError as e:  # the tester's problem, not a finding: stop
        print("diff: cannot start %s: %s" % (opts.shardc, e), file=sys.stderr, flush=True)
        os._exit(2)
    secs = time.time() - t0
    rec = {"argv": argv, "rc": rc, "stdout": out, "stderr": err, "seconds": secs, "stdlib": env["SHARDC_STDLIB"]}
    outcome, detail = judge(rc, out, err)
    if outcome != "refused" or opts.keep:
        pass
    if outcome in ("PASS", "refused") and not opts.keep:
        shutil.rmtree(d, ignore_errors=True)
    return outcome, detail, rec


def backend_args(case, opts):
    """run's backend options: none under threads; under MPI `--backend mpi` (run starts mpirun itself,
    one rank per device) and, where the mesh has more devices than --max-ranks, `--threads-per-rank T`
    with T the least divisor of the devices that brings the ranks within it (the hybrid)."""
    if opts.backend != "mpi":
        return []
    out = ["--backend", "mpi"]
    n = devices_of(case["mesh"]) if case.get("mesh") else 1
    if opts.max_ranks > 0 and n > opts.max_ranks:
        t = next(t for t in range(2, n + 1) if n % t == 0 and n // t <= opts.max_ranks)
        out += ["--threads-per-rank", str(t)]
    return out


def judge(rc, out, err):
    if rc is None:
        return "timeout", "no exit after the wall-clock limit (killed)"
    if SANITIZER.search(err):
        line = next((l for l in err.splitlines() if SANITIZER.search(l)), "")
        return "crash", "sanitizer: " + line.strip()[:200]
    if rc < 0:
        return "crash", "killed by signal %d" % -rc
    errors = [l for l in err.splitlines() if l.startswith("error|")]
    if rc == 0 and out.startswith("PASS"):
        return "PASS", ""
    if rc == 1 and out.startswith("FAIL"):
        why = next((l.strip() for l in out.splitlines() if l.strip().startswith("failure")), "")
        worst = next((l.strip() for l in out.splitlines() if l.strip().startswith("worst error")), "")
        return "FAIL", (why or worst)[:400]
    if "program failed" in err:
        line = next((l for l in err.splitlines() if "program failed" in l), "")
        if "timed out" in line:
            return "timeout", line.strip()[:300]
        return "crash", line.strip()[:300]
    if rc == 1 and errors:
        f = errors[0].split("|", 4)
        loc = len(f) == 5 and f[1] not in ("", "-") and f[2] not in ("", "0")
        msg = f[4] if len(f) == 5 else errors[0]
        if not loc:
            return "bad-refusal", "unlocated: " + msg[:300]
        what = is_known_limit(msg)
        if not what:
            return "bad-refusal", "not a documented limit: %s:%s: %s" % (os.path.basename(f[1]), f[2], msg[:300])
        return "refused", "%s (%s:%s: %s)" % (what, os.path.basename(f[1]), f[2], msg[:160])
    if rc == 2:
        return "bad-refusal", "usage error: " + err.strip()[:300]
    return "crash", "exit %s without a verdict: %s" % (rc, (err.strip().splitlines() or [""])[-1][:300])


WORST = re.compile(r"worst error\s+(\S+) abs in (\S+), (\S+) of its scale \(tolerance (\S+)\)")


def worst_of(out):
    """The report's worst tensor: [name, error over scale, tolerance over scale]."""
    m = WORST.search(out or "")
    if not m:
        return None
    try:
        return [m.group(2), float(m.group(3)), float(m.group(4))]
    except ValueError:
        return None


# ---- findings and shrinking ----

def save_finding(case, outcome, detail, rec, fdir, tag=""):
    d = os.path.join(fdir, case["id"] + tag)
    os.makedirs(d, exist_ok=True)
    text, args = render(case)
    with open(os.path.join(d, "case.shard"), "w") as f:
        f.write(text)
    with open(os.path.join(d, "case.json"), "w") as f:
        json.dump(dict(case, outcome=outcome, detail=detail), f, indent=1)
    std = "stdlib" if case["dtype"] == "f32" and rec.get("stdlib") else None
    if std:
        shutil.copytree(rec["stdlib"], os.path.join(d, "stdlib"), dirs_exist_ok=True)
    quoted = " ".join("'%s'" % a if re.search(r"[^\w.=/-]", a) else a for a in args)
    with open(os.path.join(d, "cmd.sh"), "w") as f:
        f.write("#!/bin/sh\n# %s: %s\n# %s\ncd \"$(dirname \"$0\")\"\n" % (outcome, detail, describe(case)))
        if std:
            f.write("export SHARDC_STDLIB=\"$PWD/stdlib\"\n")
        f.write("${SHARDC:-shardc} run case.shard %s --timeout 20\n" % quoted)
    with open(os.path.join(d, "output.txt"), "w") as f:
        f.write("$ %s\n(exit %s, %.1f s)\n--- stdout\n%s--- stderr\n%s" % (
            " ".join(rec.get("argv", [])), rec.get("rc"), rec.get("seconds", 0), rec.get("stdout", ""),
            rec.get("stderr", "")))
    return d


def reductions(case):
    """Smaller cases than `case`, simplest first."""
    out = []
    lay = case["layout"]
    if isinstance(lay, list):
        for i in range(len(lay)):
            out.append(dict(case, layout=lay[:i] + lay[i + 1:]))
        for i, (d, axes) in enumerate(lay):
            if len(axes) > 1:
                for a in axes:
                    out.append(dict(case, layout=lay[:i] + [[d, [a]]] + lay[i + 1:]))
    keys = case["keys"]
    simple = {"remat": None, "microbatches": None, "master": None, "zero": None, "lr": None, "optimizer": "sgd"}
    for k, v in simple.items():
        if k in keys and keys[k] != v and not (k == "microbatches" and "schedule" in keys):
            nk = dict(keys)
            if v is None:
                del nk[k]
            else:
                nk[k] = v
            out.append(dict(case, keys=nk))
    if "schedule" in keys and keys["schedule"] != "1f1b":
        out.append(dict(case, keys=dict(keys, schedule="1f1b")))
    if case["steps"] > 1:
        out.append(dict(case, steps=1))
    if case["dtype"] == "bf16":
        nk = dict(keys)
        nk.pop("master", None)
        out.append(dict(case, dtype="f32", keys=nk))
    # a mesh axis no rule names, or a size-4 axis halved
    used = set()
    if isinstance(lay, list):
        for _, axes in lay:
            used.update(axes)
    for i, (a, s) in enumerate(case["mesh"]):
        if a not in used and len(case["mesh"]) > 1:
            m = case["mesh"][:i] + case["mesh"][i + 1:]
            if devices_of(m) >= 2:
                out.append(dict(case, mesh=m))
        if s == 4:
            out.append(dict(case, mesh=case["mesh"][:i] + [[a, 2]] + case["mesh"][i + 1:]))
    return out


def devices_of(mesh):
    n = 1
    for _, s in mesh:
        n *= s
    return n


def same_failure(outcome, detail, want_outcome, want_detail):
    if outcome != want_outcome:
        return False
    if outcome == "bad-refusal":
        return re.sub(r"\d+", "N", detail)[:60] == re.sub(r"\d+", "N", want_detail)[:60]
    return True


def shrink(case, outcome, detail, opts, work, budget):
    """Greedy: take the first reduction that fails the same way, until none does or the budget of
    runs is spent."""
    best = dict(case, id=case["id"] + ".s")
    tried = 0
    progress = True
    while progress and tried < budget:
        progress = False
        for r in reductions(best):
            if tried >= budget:
                break
            tried += 1
            r = dict(r, id="%s.s%d" % (case["id"], tried))
            o, dt, rec = run_case(r, opts, work)
            shutil.rmtree(os.path.join(work, r["id"]), ignore_errors=True)
            if same_failure(o, dt, outcome, detail):
                best, progress = r, True
                best_rec, best_detail = rec, dt
                break
    if best["id"] == case["id"] + ".s":
        return None
    return best, best_detail, best_rec, tried


# ---- the regression list ----

def load_regressions(path):
    cases = []
    if not os.path.isdir(path):
        return cases
    for fn in sorted(os.listdir(path)):
        if fn.endswith(".json"):
            with open(os.path.join(path, fn)) as f:
                c = json.load(f)
            c["id"] = "regress." + fn[:-5]
            c.setdefault("expect", "PASS")
            cases.append(c)
    return cases


# ---- main ----

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shardc", default=os.path.join(ROOT, "build", "shardc"))
    ap.add_argument("--cases", type=int, default=100, help="random cases to run (default 100)")
    ap.add_argument("--seed", default="1", help="the seed the cases are made from (default 1)")
    ap.add_argument("--first", type=int, default=0, help="the index of the first case (default 0)")
    ap.add_argument("--only", default="", help="comma-separated case indices to run alone")
    ap.add_argument("--sample", default="", help="only cases of samples whose name contains this")
    ap.add_argument("--regress", action="store_true", help="also run the regression list (tests/diff/regress/)")
    ap.add_argument("--regress-only", action="store_true", help="run the regression list alone")
    ap.add_argument("--jobs", "-j", type=int, default=2)
    ap.add_argument("--findings", default="diff-findings", help="where findings are saved (default ./diff-findings)")
    ap.add_argument("--shrink", type=int, default=25, help="runs spent shrinking each finding (0: none)")
    ap.add_argument("--timeout", type=float, default=20, help="run's --timeout: a collective's longest wait")
    ap.add_argument("--wall", type=float, default=300, help="seconds before a case is killed as a timeout")
    ap.add_argument("--case", action="append", default=[], help="run the case a findings' case.json (or a regression) holds")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="with --case: change the case (dtype=f32, steps=1, keys.remat=none, keys.microbatches=-, "
                         "layout=[[\"batch\",[\"data\"]]], ...; a value is JSON where it parses, '-' removes the key)")
    ap.add_argument("--dump", action="store_true", help="print the cases' descriptions and programs, run nothing")
    ap.add_argument("--keep", action="store_true", help="keep every case's work directory")
    ap.add_argument("--work", default="", help="work directory (default: a temporary one, removed)")
    ap.add_argument("--json", default="", help="write every case's outcome to this file")
    ap.add_argument("--backend", choices=["threads", "mpi"], default="threads",
                    help="the runtime backend each case runs on: run's --backend (mpi: run starts mpirun itself)")
    ap.add_argument("--max-ranks", type=int, default=0,
                    help="under --backend mpi, the most ranks a case starts: a mesh of more devices runs as the "
                    "hybrid, --threads-per-rank the least divisor that fits (default 0: one rank per device)")
    ap.add_argument("--known", default="", help="a file of open findings (ID OUTCOME TEXT per line, known.txt): each must "
                    "recur as listed (then it does not fail the run) or the run fails asking for the line's removal")
    opts = ap.parse_args()
    opts.coll_timeout = opts.timeout
    opts.wall_timeout = opts.wall
    opts.env = {}
    if not os.access(opts.shardc, os.X_OK):
        print("diff: no shardc at %s (build it first, or give --shardc)" % opts.shardc, file=sys.stderr)
        return 2

    cases = []
    if not opts.regress_only:
        idx = [int(i) for i in opts.only.split(",") if i] if opts.only else range(opts.first, opts.first + opts.cases)
        for i in idx:
            c = make_case(opts.seed, i)
            if opts.sample and opts.sample not in c["sample"]:
                continue
            cases.append(c)
    if opts.regress or opts.regress_only:
        cases += load_regressions(os.path.join(HERE, "regress"))
    if opts.case:
        cases = []
        for i, path in enumerate(opts.case):
            with open(path) as f:
                c = json.load(f)
            for kv in opts.set:
                k, v = kv.split("=", 1)
                try:
                    v = json.loads(v)
                except ValueError:
                    pass
                node = c
                *path_keys, last = k.split(".")
                for pk in path_keys:
                    node = node.setdefault(pk, {})
                if v == "-":
                    node.pop(last, None)
                else:
                    node[last] = v
            c["id"] = "case%d" % i if len(opts.case) > 1 else "case"
            cases.append(c)

    if opts.dump:
        for c in cases:
            text, args = render(c)
            print("== %s: %s\n   shardc run case.shard %s" % (c["id"], describe(c), " ".join(args)))
        return 0

    work = opts.work or tempfile.mkdtemp(prefix="shardc-diff-")
    os.makedirs(work, exist_ok=True)
    counts = {k: 0 for k in ["PASS", "refused", "FAIL", "crash", "timeout", "bad-refusal"]}
    results = []
    findings = []
    lock = threading.Lock()
    t_start = time.time()

    def one(c):
        outcome, detail, rec = run_case(c, opts, work)
        expect = c.get("expect")
        if expect and expect != "PASS":  # a regression case expected to be refused: by that message
            ok = outcome == "refused" and expect in detail
            if not ok and outcome in ("PASS", "refused"):
                outcome, detail = "bad-refusal", "expected a refusal containing %r, got %s %s" % (expect, outcome, detail)
        with lock:
            counts[outcome] += 1
            n = sum(counts.values())
            print("%4d/%d %-11s %-22s %5.1fs  %s%s" % (n, len(cases), outcome, c["id"], rec.get("seconds", 0),
                                                       describe(c), ("\n" + " " * 12 + detail) if detail else ""),
                  flush=True)
            results.append(dict(id=c["id"], outcome=outcome, detail=detail, case=describe(c),
                                seconds=round(rec.get("seconds", 0), 2), worst=worst_of(rec.get("stdout", ""))))
        if outcome not in ("PASS", "refused"):
            d = save_finding(c, outcome, detail, rec, opts.findings)
            if not opts.keep:
                shutil.rmtree(os.path.join(work, c["id"]), ignore_errors=True)
            findings.append((c, outcome, detail, d))

    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, opts.jobs)) as ex:
        list(ex.map(one, cases))

    # shrink each finding (in parallel too)
    def shrink_one(f):
        c, outcome, detail, d = f
        if opts.shrink <= 0 or c["id"].startswith("regress."):
            return
        try:
            r = shrink(c, outcome, detail, opts, work, opts.shrink)
        except Exception as e:  # a tester bug must not lose the run's counts
            print("  shrinking %s failed: %r" % (c["id"], e), flush=True)
            return
        if r:
            s, sd, srec, tried = r
            save_finding(s, outcome, sd, srec, d, "")
            with lock:
                print("  shrunk %s in %d runs: %s" % (c["id"], tried, describe(s)), flush=True)

    if findings and opts.shrink > 0:
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, opts.jobs)) as ex:
            list(ex.map(shrink_one, findings))

    if not opts.work and not opts.keep:
        shutil.rmtree(work, ignore_errors=True)
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(dict(seed=opts.seed, counts=counts, results=sorted(results, key=lambda r: r["id"])), f, indent=1)
    total = sum(counts.values())
    print("diff: %d cases in %.0f s: %s" % (total, time.time() - t_start,
                                            ", ".join("%d %s" % (counts[k], k) for k in counts)))
    if findings:
        print("diff: findings saved in %s/" % opts.findings)
    bad = total - counts["PASS"] - counts["refused"]
    if opts.known:  # open findings, listed with their outcome and message: expected until fixed
        known = {}
        for line in open(opts.known, encoding="utf-8"):
            if line.strip() and not line.startswith("#"):
                cid, outcome, text = line.rstrip("\n").split(None, 2)
                known[cid] = (outcome, text)
        ran = {r["id"]: r for r in results}
        for cid, (outcome, text) in sorted(known.items()):
            r = ran.get(cid)
            if r is None:
                continue
            if r["outcome"] == outcome and text in r["detail"]:
                bad -= 1
                print("diff: known open finding %s (%s: %s), listed in %s" % (cid, outcome, text, os.path.basename(opts.known)))
            else:
                bad += 1
                print("diff: %s is listed as an open finding (%s) but was %s: update %s" % (cid, outcome, r["outcome"], opts.known))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
