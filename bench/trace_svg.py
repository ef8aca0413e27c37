#!/usr/bin/env python3
"""trace_svg.py: draws a Chrome trace written by `shardc sim --trace` as an SVG picture (for docs).

Usage: bench/trace_svg.py TRACE.json OUT.svg [--from SECONDS] [--to SECONDS] [--width PX]
                          [--title TEXT] [--depth N] [--threads compute,comm,p2p]

One row per thread (a simulated device's stream), in the trace's process and thread order; one bar
per slice, coloured by stream kind (compute, comm, p2p), nested slices (a pipeline region's kernels)
drawn as thinner bars inside their parent, up to --depth levels (default 1: top-level slices
only). Labels are drawn where a bar is wide enough. Python 3 standard library only."""
import argparse
import json
from xml.sax.saxutils import escape

COLOURS = {"compute": "#4e79a7", "comm": "#f28e2b", "p2p": "#59a14f"}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("out")
    ap.add_argument("--from", dest="t0", type=float, default=None, help="window start, seconds")
    ap.add_argument("--to", dest="t1", type=float, default=None, help="window end, seconds")
    ap.add_argument("--width", type=int, default=1100)
    ap.add_argument("--title", default=None)
    ap.add_argument("--depth", type=int, default=1, help="nesting levels drawn (1: top-level slices)")
    ap.add_argument("--threads", default=None, help="only threads whose name starts with one of these (comma-separated)")
    a = ap.parse_args()

    with open(a.trace) as f:
        tr = json.load(f)
    ev = tr["traceEvents"]
    pname, tname, order = {}, {}, []
    for e in ev:
        if e.get("ph") != "M":
            continue
        if e["name"] == "process_name":
            pname[e["pid"]] = e["args"]["name"]
        elif e["name"] == "thread_name":
            name = e["args"]["name"]
            tname[(e["pid"], e["tid"])] = name
            if a.threads is None or any(name.startswith(k) for k in a.threads.split(",")):
                order.append((e["pid"], e["tid"]))
    slices = [e for e in ev if e.get("ph") == "X"]
    end = max((e["ts"] + e["dur"] for e in slices), default=1.0)
    t0 = a.t0 * 1e6 if a.t0 is not None else 0.0
    t1 = a.t1 * 1e6 if a.t1 is not None else end
    rows = sorted(order)
    row_of = {k: i for i, k in enumerate(rows)}

    labels = {k: f"{pname.get(k[0], k[0])}: {tname.get(k, k[1])}" for k in rows}
    left = 12 + int(6.3 * max((len(v) for v in labels.values()), default=10))
    top, rowh, gap = 40, 22, 4
    width = a.width
    plot = width - left - 20
    height = top + len(rows) * (rowh + gap) + 40
    scale = plot / (t1 - t0)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="Helvetica, Arial, sans-serif" font-size="11">',
           f'<rect width="{width}" height="{height}" fill="white"/>']
    title = a.title or f"shardc sim trace: {escape(tr.get('otherData', {}).get('generator', ''))}"
    out.append(f'<text x="{left}" y="20" font-size="13" font-weight="bold">{escape(title)}</text>')
    for (pid, tid), i in row_of.items():
        y = top + i * (rowh + gap)
        label = labels[(pid, tid)]
        out.append(f'<text x="{left - 6}" y="{y + rowh * 0.7:.1f}" text-anchor="end">{escape(label)}</text>')
        out.append(f'<rect x="{left}" y="{y}" width="{plot}" height="{rowh}" fill="#f4f4f4"/>')

    # narrow bars (under 1.5 px) closer than half a pixel to a narrow one before them on the same
    # row, depth and colour merge into it (a step of thousands of kernels stays a small file)
    bars = []

    def bar(x, y, w, h, colour, opacity, title):
        if bars and w < 1.5:
            b = bars[-1]
            if b[1] == y and b[3] == h and b[4] == colour and b[2] < 1.5 + (0 if b[6] else 1e9) \
                    and x <= b[0] + b[2] + 0.5:
                b[2] = max(b[2], x + w - b[0])
                b[6] = None
                return
        bars.append([x, y, w, h, colour, opacity, title])

    texts = []
    # nesting depth per (thread) by containment, slices sorted by start then longest first
    by_row = {}
    for e in slices:
        by_row.setdefault((e["pid"], e["tid"]), []).append(e)
    for key, lst in by_row.items():
        if key not in row_of:
            continue
        lst.sort(key=lambda e: (e["ts"], -e["dur"]))
        stack = []
        y0 = top + row_of[key] * (rowh + gap)
        for e in lst:
            s, t = e["ts"], e["ts"] + e["dur"]
            while stack and stack[-1] <= s + 1e-3:
                stack.pop()
            depth = len(stack)
            stack.append(t)
            if depth >= a.depth or t < t0 or s > t1:
                continue
            x = left + (max(s, t0) - t0) * scale
            w = max((min(t, t1) - max(s, t0)) * scale, 0.6)
            inset = 3 * depth
            h = rowh - 2 * inset
            colour = COLOURS.get(e.get("cat"), "#999999")
            opacity = 1.0 if depth == 0 else 0.75
            bar(x, y0 + inset, w, h, colour, opacity, f'{e["name"]}: {e["dur"] / 1e3:.3f} ms')
            name = e["name"].split(" (")[0]
            if w > 7 * len(name) * 0.62 and depth == 0:
                texts.append(f'<text x="{x + 3:.2f}" y="{y0 + rowh * 0.7:.1f}" fill="white" font-size="10">'
                             f'{escape(name)}</text>')
    for x, y, w, h, colour, opacity, title in bars:
        tip = f"<title>{escape(title)}</title>" if title and w >= 2 else ""
        op = "" if opacity == 1.0 else f' fill-opacity="{opacity}"'
        edge = ' stroke="white" stroke-width="0.6"' if w >= 3 else ""
        out.append(f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{h}" fill="{colour}"{op}{edge}>{tip}</rect>')
    out.extend(texts)

    # time axis
    ya = top + len(rows) * (rowh + gap) + 14
    span = (t1 - t0) / 1e6
    step = 10 ** len(str(int(span))) / 10 if span >= 1 else 0.1
    while span / step > 12:
        step *= 2
    while span / step < 4:
        step /= 2
    k = 0
    while k * step <= span + 1e-12:
        x = left + k * step * 1e6 * scale
        out.append(f'<line x1="{x:.1f}" y1="{top - 4}" x2="{x:.1f}" y2="{ya - 10}" stroke="#ccc" stroke-width="0.5"/>')
        lab = f"{t0 / 1e6 + k * step:.3g} s"
        out.append(f'<text x="{x:.1f}" y="{ya}" text-anchor="middle" fill="#555">{lab}</text>')
        k += 1
    lx = left
    for name, colour in COLOURS.items():
        out.append(f'<rect x="{lx}" y="{ya + 10}" width="12" height="10" fill="{colour}"/>')
        out.append(f'<text x="{lx + 16}" y="{ya + 19}">{name}</text>')
        lx += 90
    out.append("</svg>")
    with open(a.out, "w") as f:
        f.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
