#!/usr/bin/env python3
"""Renders a towerlab Chrome trace (Trainer::set_trace, fashion_mnist --trace) as a
PNG timeline: for each tower a lane of its layers (forward solid, backward
hatched, one colour per layer), a lane for the master's update (with the master
sharded, each tower's update of its slice sits on the tower's lane) and, in a job of
several processes, a lane for each rank's all-reduce between processes, with
dashed lines where each traced step starts; below, a zoom on the first traced
step's ring (a lane per member: reduce-scatter and all-gather, or the reduce into
tower 0 that CPU towers of a host master take, each step labelled with its chunk, and
a sharded tower's guard check and update between them), too short to see beside the
layers. A trace of several ranks (mpirun)
shows every rank's lanes, labelled with the rank.

    python3 scripts/trace_png.py step.json docs/img/trace.png [--title TEXT]

Needs matplotlib (Debian: python3-matplotlib). Exits 2 with one line on stderr
for a file that is not a trace with spans.
"""
import argparse
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

RING_COLOURS = {"reduce-scatter": "#4c72b0", "all-gather": "#55a868", "reduce": "#64b5cd"}
MASTER_COLOUR = "#c44e52"
PROCESSES_COLOUR = "#8172b2"
BUCKETS_COLOUR = "#937860"
GUARD_COLOUR = "#dd8452"


def fail(message):
    print(f"trace_png: {message}", file=sys.stderr)
    sys.exit(2)


def load(path):
    try:
        with open(path, encoding="utf-8") as f:
            trace = json.load(f)
    except (OSError, ValueError) as e:
        fail(f"{path}: cannot read a trace: {e}")
    return parse(trace, path)


def parse(trace, path):
    """(row names, spans) of a loaded trace; `path` names it in errors."""
    events = trace.get("traceEvents") if isinstance(trace, dict) else None
    if not isinstance(events, list):
        fail(f"{path}: no traceEvents list (not a Chrome trace)")
    # A row is (pid, tid): in a job's trace each rank is a process.
    processes = {e["pid"]: e["args"]["name"] for e in events
                 if e.get("ph") == "M" and e.get("name") == "process_name"}
    names = {(e.get("pid", 0), e["tid"]): e["args"]["name"] for e in events
             if e.get("ph") == "M" and e.get("name") == "thread_name"}
    if len(processes) > 1:
        names = {row: f"{processes.get(row[0], row[0]).split(' (')[0]}: {name}"
                 for row, name in names.items()}
    spans = [e for e in events if e.get("ph") == "X"]
    if not spans:
        fail(f"{path}: the trace holds no spans")
    for s in spans:
        s["row"] = (s.get("pid", 0), s["tid"])
    return names, spans


def layer_colours(spans):
    """One colour per layer name, in the order the layers first run."""
    palette = plt.get_cmap("tab20").colors
    order = []
    for s in sorted(spans, key=lambda s: s["ts"]):
        if s.get("cat") in ("forward", "backward") and s["name"] not in order:
            order.append(s["name"])
    return {name: palette[i % len(palette)] for i, name in enumerate(order)}


def draw_ring(ax, spans, lanes, origin_ms):
    """Ring steps on their members' lanes, labelled with their chunk, and a sharded
    tower's check of its slice (a "guard" span) and update of it (a "master" span on a
    tower's row) between them."""
    index = {key: i for i, key in enumerate(lanes)}
    end_ms = max(s["ts"] + s["dur"] for s in spans) / 1000.0 - origin_ms
    for s in spans:
        x, w = s["ts"] / 1000.0 - origin_ms, s["dur"] / 1000.0
        if s.get("cat") == "ring" and (s["row"], "ring") in index:
            y = index[(s["row"], "ring")]
            phase = s["name"].rsplit(" ", 1)[0]
            ax.broken_barh([(x, w)], (y - 0.35, 0.7), facecolors=RING_COLOURS.get(phase, "grey"),
                           edgecolor="white", linewidth=0.5)
            chunk = s.get("args", {}).get("chunk")
            if chunk is not None and w > end_ms / 60:
                ax.text(x + w / 2, y, f"chunk {chunk}", ha="center", va="center", fontsize=7,
                        color="white")
        elif s.get("cat") in ("master", "guard") and (s["row"], "ring") in index:
            colour = GUARD_COLOUR if s["cat"] == "guard" else MASTER_COLOUR
            ax.broken_barh([(x, w)], (index[(s["row"], "ring")] - 0.35, 0.7),
                           facecolors=colour, edgecolor="white", linewidth=0.5)


def render(names, spans, out, title):
    colours = layer_colours(spans)
    # A master row without spans (the master sharded over the towers) gets no lane.
    rows = sorted({s["row"] for s in spans} | set(names))
    is_master = {r: names.get(r, "").split(": ")[-1].startswith("master") for r in rows}
    rows = [r for r in rows if not is_master[r] or any(s["row"] == r for s in spans)]
    master_rows = [r for r in rows if is_master[r]]
    processes_rows = [r for r in rows if names.get(r, "").split(": ")[-1] == "processes"]
    buckets_rows = [r for r in rows if names.get(r, "").split(": ")[-1] == "gradient buckets"]
    tower_rows = [r for r in rows
                  if r not in master_rows and r not in processes_rows and r not in buckets_rows]
    ring = [s for s in spans if s.get("cat") == "ring"]

    # Top: each tower's layers, and the master. Bottom: a zoom on the first traced
    # step's ring, too short to see at the top.
    lanes = sorted([(r, "layers") for r in tower_rows] + [(r, "master") for r in master_rows]
                   + [(r, "processes") for r in processes_rows]
                   + [(r, "buckets") for r in buckets_rows])
    labels = [names.get(r, f"row {r[1]}") for r, _ in lanes]
    index = {key: i for i, key in enumerate(lanes)}
    heights = [len(lanes), len(tower_rows)] if ring else [len(lanes)]
    fig, axes = plt.subplots(len(heights), 1, figsize=(14, 1.2 + 0.6 * sum(heights) + 0.8),
                             gridspec_kw={"height_ratios": heights}, squeeze=False)
    ax = axes[0][0]
    end_ms = max(s["ts"] + s["dur"] for s in spans) / 1000.0
    for s in spans:
        cat = s.get("cat")
        x, w = s["ts"] / 1000.0, s["dur"] / 1000.0
        if cat in ("forward", "backward") and (s["row"], "layers") in index:
            y = index[(s["row"], "layers")]
            ax.broken_barh([(x, w)], (y - 0.4, 0.8), facecolors=colours[s["name"]],
                           edgecolor="white", linewidth=0.3,
                           hatch="///" if cat == "backward" else None)
        elif cat == "tower" and (s["row"], "layers") in index:
            # The tower's whole forward or backward: a thin bar under its layers.
            y = index[(s["row"], "layers")]
            ax.broken_barh([(x, w)], (y + 0.42, 0.08), facecolors="black")
        elif cat in ("master", "guard") and (s["row"], "layers") in index:
            # Sharded: the tower's check and update of its own slice, widened to be seen.
            ax.broken_barh([(x, max(w, end_ms / 300))], (index[(s["row"], "layers")] - 0.4, 0.8),
                           facecolors=GUARD_COLOUR if cat == "guard" else MASTER_COLOUR)
        else:
            # Widened to be seen beside the layers.
            for kind, colour in (("master", MASTER_COLOUR), ("processes", PROCESSES_COLOUR),
                                 ("buckets", BUCKETS_COLOUR)):
                if (s["row"], kind) in index:
                    ax.broken_barh([(x, max(w, end_ms / 300))],
                                   (index[(s["row"], kind)] - 0.35, 0.7), facecolors=colour)

    steps = {}
    for s in spans:
        step = s.get("args", {}).get("step")
        if step is not None:
            steps[step] = min(steps.get(step, s["ts"]), s["ts"])
    for step, ts in sorted(steps.items()):
        ax.axvline(ts / 1000.0, color="grey", linestyle="--", linewidth=0.8)
        ax.text(ts / 1000.0, -0.75, f" step {step}", fontsize=8, color="dimgrey", va="bottom")
    ax.set_yticks(range(len(lanes)))
    ax.set_yticklabels(labels, fontsize=8)
    ax.set_ylim(len(lanes) - 0.4, -0.8)
    ax.set_xlim(0, end_ms * 1.01)
    ax.set_xlabel("ms from the first span")
    ax.grid(axis="x", linewidth=0.3)
    legend = [Patch(facecolor=c, label=n) for n, c in colours.items()]
    legend += [Patch(facecolor="white", edgecolor="black", hatch="///", label="(backward)")]
    phases = {s["name"].rsplit(" ", 1)[0] for s in spans if s.get("cat") == "ring"}
    legend += [Patch(facecolor=c, label="reduce into tower 0" if n == "reduce" else n)
               for n, c in RING_COLOURS.items() if n in phases]
    if master_rows:
        legend.append(Patch(facecolor=MASTER_COLOUR, label="update + broadcast"))
    elif any(s.get("cat") == "master" for s in spans):
        legend.append(Patch(facecolor=MASTER_COLOUR, label="update of the tower's slice"))
    if any(s.get("cat") == "guard" for s in spans):
        legend.append(Patch(facecolor=GUARD_COLOUR, label="guard: the slice checked for NaN, inf"))
    if processes_rows:
        legend.append(Patch(facecolor=PROCESSES_COLOUR, label="all-reduce between processes"))
    if buckets_rows:
        legend.append(Patch(facecolor=BUCKETS_COLOUR, label="gradient bucket all-reduce"))
    ax.legend(handles=legend, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7,
              frameon=False)
    if title:
        ax.set_title(title, fontsize=10)

    if ring:
        first_step = min((s.get("args", {}).get("step", 0) for s in ring))
        updates = [s for s in spans
                   if s.get("cat") in ("master", "guard") and s["row"] in tower_rows]
        window = [s for s in ring + updates if s.get("args", {}).get("step", 0) == first_step]
        origin_ms = min(s["ts"] for s in window) / 1000.0
        zoom_lanes = [(r, "ring") for r in tower_rows]
        zoom = axes[1][0]
        draw_ring(zoom, window, zoom_lanes, origin_ms)
        zoom.set_yticks(range(len(zoom_lanes)))
        zoom.set_yticklabels([f"{names.get(r, r)} ring" for r, _ in zoom_lanes], fontsize=8)
        zoom.set_ylim(len(zoom_lanes) - 0.4, -0.6)
        zoom.set_xlabel(f"ms from the ring's first step (zoom on step {first_step})")
        zoom.grid(axis="x", linewidth=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace", help="Chrome trace JSON written by towerlab")
    parser.add_argument("png", help="PNG file to write")
    parser.add_argument("--title", default="", help="title above the timeline")
    args = parser.parse_args()
    names, spans = load(args.trace)
    render(names, spans, args.png, args.title)


if __name__ == "__main__":
    main()
