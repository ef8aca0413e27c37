#!/usr/bin/python3
"""report_check.py: `shardc report FILE -o PAGE` against check's, sim's and explain's own JSON,
and in a real browser (issue 22).

  report_check.py --shardc BUILD/shardc --out DIR [--browser CHROMIUM] FILE.shard [shardc options]

1. Runs `report` and, separately, `check`, `sim` and `explain --format json` with the same options.
2. Parses the page with html.parser: no external resource (no src=, href= or url( pointing
   anywhere, no <link>, no <script> but the JSON data block); the data block's "check" and "sim"
   equal the commands' objects (durations aside: none, the simulation is deterministic) and every
   drawn figure equals its source: the phase rows' data-time-s and data-flops-per-s equal sim's
   phases; the peak memory bars' class bytes equal check's per_device (and per_stage) classes, the
   resident bars' each stage's resident state (optimizer = moments + master; the device's without a
   pipeline), and their
   data-capacity its capacity; the collectives rows' counts and bytes equal sums over explain's
   collectives computed here by (kind, axes); one grid per param up to 48, the first three grids' cells equal
   `explain --show NAME`'s; where a grid covers the mesh, every device is in exactly one cell.
3. With --browser: renders the page headless to PNG (must be a PNG of non-trivial size) and dumps
   its DOM with logging to stderr; any console message of level error (a script error, a blocked
   resource) fails. Exit 1 on any mismatch, naming it.
"""
import argparse
import json
import os
import subprocess
import sys
from html.parser import HTMLParser

fails = []


def fail(msg):
    fails.append(msg)
    print("FAIL", msg)


class Page(HTMLParser):
    def __init__(self):
        super().__init__()
        self.data = None
        self.in_data = False
        self.buf = ""
        self.phases, self.bars, self.colls, self.grids = [], [], [], []
        self.cur_bar = None
        self.cur_grid = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        for k, v in attrs:
            if k in ("src", "href") or (v and "url(" in v):
                fail(f"external reference <{tag} {k}={v!r}>")
        if tag == "link":
            fail("a <link> element")
        if tag == "script":
            if a.get("type") != "application/json" or a.get("id") != "shardc-data":
                fail(f"a script other than the data block: {a}")
            self.in_data = True
        if tag == "tr" and a.get("class") == "phase":
            self.phases.append(a)
        if tag == "tr" and a.get("class") == "coll":
            self.colls.append(a)
        if tag == "svg" and "data-total" in a:
            self.cur_bar = {"kind": a.get("data-kind"), "capacity": float(a["data-capacity"]), "classes": {}}
            self.bars.append(self.cur_bar)
        if tag == "rect" and self.cur_bar is not None and "data-class" in a:
            self.cur_bar["classes"][a["data-class"]] = float(a["data-bytes"])
        if tag == "div" and a.get("class") == "grid":
            self.cur_grid = {"param": a["data-param"], "devices": []}
            self.grids.append(self.cur_grid)
        if tag == "td" and self.cur_grid is not None and "data-devices" in a:
            self.cur_grid["devices"].append(a["data-devices"])
            self.cur_grid["count"] = self.cur_grid.get("count", 0) + int(float(a["data-count"]))

    def handle_endtag(self, tag):
        if tag == "script" and self.in_data:
            self.in_data = False
            self.data = json.loads(self.buf)
        if tag == "svg":
            self.cur_bar = None
        if tag == "div":
            self.cur_grid = None

    def handle_data(self, d):
        if self.in_data:
            self.buf += d


def run_json(shardc, cmd, file, opts):
    p = subprocess.run([shardc, cmd, file, "--format", "json"] + opts, capture_output=True, text=True)
    return json.loads(p.stdout)


def close(a, b):
    return abs(a - b) <= 1e-9 * max(abs(a), abs(b), 1)


def device_list(s):
    out = []
    for part in s.split(","):
        part = part.strip()
        if "-" in part:
            lo, hi = part.split("-")
            out += range(int(lo), int(hi) + 1)
        elif part:
            out.append(int(part))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shardc", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--browser")
    ap.add_argument("file")
    ap.add_argument("opts", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    page = os.path.join(a.out, "report.html")
    p = subprocess.run([a.shardc, "report", a.file, "-o", page] + a.opts, capture_output=True, text=True)
    if p.returncode != 0:
        print(p.stderr)
        fail(f"report exited {p.returncode}")
        return 1
    check = run_json(a.shardc, "check", a.file, a.opts)
    sim = run_json(a.shardc, "sim", a.file, a.opts)
    explain = run_json(a.shardc, "explain", a.file, a.opts)
    html = open(page, encoding="utf-8").read()
    pg = Page()
    pg.feed(html)
    if pg.data is None:
        fail("no data block")
        return 1
    if pg.data["check"] != check:
        fail("the data block's check differs from check --format json")
    if pg.data["sim"] != sim:
        fail("the data block's sim differs from sim --format json")
    # phases as drawn
    if len(pg.phases) != len(sim["phases"]):
        fail(f"{len(pg.phases)} phase rows, sim has {len(sim['phases'])}")
    for row, ph in zip(pg.phases, sim["phases"]):
        if row["data-phase"] != ph["phase"] or not close(float(row["data-time-s"]), ph["time_s"]) \
                or not close(float(row["data-flops-per-s"]), ph["flops_per_s"]):
            fail(f"phase row {row} against sim's {ph}")
    # memory bars: the peak ones (the device's, then one per stage) by class, and the resident ones
    # (each stage's under a pipeline, else the device's): params, grads, optimizer = moments + master
    mem = check["memory"]
    want = [mem["per_device"]] + mem.get("per_stage", [])
    holders = mem.get("per_stage") or [mem]
    for h in holders:
        r = h.get("resident")
        if r is not None:
            want.append({"params": r["params"], "grads": r["grads"], "optimizer": r["moments"] + r["master"],
                         "activations": 0, "temporaries": 0, "total": r["total"], "kind": "resident"})
    kinds = [w.get("kind", "peak") for w in want]
    if [b["kind"] for b in pg.bars] != kinds:
        fail(f"memory bars {[b['kind'] for b in pg.bars]}, check gives {kinds}")
    for bar, w in zip(pg.bars, want):
        if not close(bar["capacity"], mem["capacity"]):
            fail(f"bar capacity {bar['capacity']} against {mem['capacity']}")
        for k in ("params", "grads", "optimizer", "activations", "temporaries"):
            if not close(bar["classes"].get(k, 0.0), float(w[k])):
                fail(f"bar {k} {bar['classes'].get(k)} against check's {w[k]}")
        if not close(sum(bar["classes"].values()), float(w["total"])):
            fail(f"bar classes sum {sum(bar['classes'].values())} against check's total {w['total']}")
    # collectives by (kind, axes), summed here from explain's list
    sums = {}
    for c in explain["collectives"]:
        key = (c["kind"], ", ".join(c["axes"]))
        n, b = sums.get(key, (0, 0))
        sums[key] = (n + 1, b + c["bytes_per_device"])
    got = {(r["data-kind"], r["data-axes"]): (int(r["data-count"]), float(r["data-bytes"])) for r in pg.colls}
    if set(got) != set(sums):
        fail(f"collective rows {sorted(got)} against explain's {sorted(sums)}")
    for k, (n, b) in sums.items():
        if k in got and (got[k][0] != n or not close(got[k][1], b)):
            fail(f"collectives {k}: page {got[k]}, explain {n, b}")
    # grids: one per param (48 at most), each device once in each
    params = [o["name"] for o in explain["ops"] if o["op"] == "param"]
    if len(pg.grids) != min(len(params), 48):
        fail(f"{len(pg.grids)} grids for {len(params)} params")
    for i, g in enumerate(pg.grids):
        if i < 3:  # the drawn cells equal explain --show NAME's (which may draw part of a big mesh)
            show = run_json(a.shardc, "explain", a.file, a.opts + ["--show", g["param"]])
            want = [c["devices"] for row in show["cells"] for c in row]
            if g["devices"] != want:
                fail(f"grid of {g['param']}: cells {g['devices'][:6]} against explain --show's {want[:6]}")
        if g.get("count", 0) > check["devices"]:
            fail(f"grid of {g['param']}: its cells hold {g.get('count')} devices, the mesh {check['devices']}")
        if g.get("count") != check["devices"] or any("..." in cell for cell in g["devices"]):
            continue  # part of the mesh drawn, or a long list abbreviated
        devs = sorted(d for cell in g["devices"] for d in device_list(cell))
        if devs != list(range(check["devices"])):
            fail(f"grid of {g['param']}: devices {devs[:12]}... are not each of 0..{check['devices'] - 1} once")
    if a.browser:
        png = os.path.join(a.out, "report.png")
        prof = os.path.join(a.out, "profile")
        base = [a.browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                f"--user-data-dir={prof}", "--enable-logging=stderr", "--v=0"]
        url = "file://" + os.path.abspath(page)
        r = subprocess.run(base + [f"--screenshot={png}", "--window-size=1280,2400", url],
                           capture_output=True, text=True, timeout=180)
        if r.returncode != 0 or not os.path.exists(png):
            fail(f"chromium --screenshot exited {r.returncode}: {r.stderr[-800:]}")
        else:
            with open(png, "rb") as f:
                head = f.read(8)
            if head != b"\x89PNG\r\n\x1a\n" or os.path.getsize(png) < 10000:
                fail(f"{png} is not a PNG of a drawn page ({os.path.getsize(png)} bytes)")
        d = subprocess.run(base + ["--dump-dom", url], capture_output=True, text=True, timeout=180)
        console = [l for l in (r.stderr + d.stderr).splitlines() if "CONSOLE" in l or "Uncaught" in l]
        if console:
            fail("console messages: " + " | ".join(console[:5]))
        if 'id="shardc-data"' not in d.stdout or "Timeline of the simulated step" not in d.stdout:
            fail("the browser's DOM lacks the data block or the timeline")
    print(f"{'FAIL' if fails else 'PASS'}: report of {a.file} {' '.join(a.opts)} ({len(fails)} mismatches)")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
