#!/usr/bin/env python3
"""Renders a towerlab Chrome trace (Trainer::set_trace, fashion_mnist --trace) as a
PNG timeline: for each tower a lane of its layers (forward solid, backward
hatched, one colour per layer) and a lane of its ring steps (reduce-scatter and
all-gather, each labelled with its chunk), and a lane for the master's update.
Dashed lines mark where each traced step starts.

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

RING_COLOURS = {"reduce-scatter": "#4c72b0", "all-gather": "#55a868"}
MASTER_COLOUR = "#c44e52"


def fail(message):
    print(f"trace_png: {message}", file=sys.stderr)
    sys.exit(2)


def load(path):
    try:
        with open(path, encoding="utf-8") as f:
            trace = json.load(f)
    except (OSError, ValueError) as e:
        fail(f"{path}: cannot read a trace: {e}")
    events = trace.get("traceEvents") if isinstance(trace, dict) else None
    if not isinstance(events, list):
        fail(f"{path}: no traceEvents list (not a Chrome trace)")
    names = {e["tid"]: e["args"]["name"] for e in events
             if e.get("ph") == "M" and e.get("name") == "thread_name"}
    spans = [e for e in events if e.get("ph") == "X"]
    if not spans:
        fail(f"{path}: the trace holds no spans")
    return names, spans


def layer_colours(spans):
    """One colour per layer name, in the order the layers first run."""
    palette = plt.get_cmap("tab20").colors
    order = []
    for s in sorted(spans, key=lambda s: s["ts"]):
        if s.get("cat") in ("forward", "backward") and s["name"] not in order:
            order.append(s["name"])
    return {name: palette[i % len(palette)] for i, name in enumerate(order)}


def render(names, spans, out, title):
    colours = layer_colours(spans)
    rows = sorted({s["tid"] for s in spans} | set(names))
    master_rows = [r for r in rows if names.get(r, "").startswith("master")]
    tower_rows = [r for r in rows if r not in master_rows]

    # Lanes top to bottom: each tower's layers, then its ring; the master last.
    lanes = []
    for r in tower_rows:
        label = names.get(r, f"row {r}")
        lanes.append((r, "layers", f"{label}\nlayers"))
        if any(s["tid"] == r and s.get("cat") == "ring" for s in spans):
            lanes.append((r, "ring", f"{label}\nring"))
    for r in master_rows:
        lanes.append((r, "master", names[r]))
    index = {(r, kind): i for i, (r, kind, _) in enumerate(lanes)}

    end_ms = max(s["ts"] + s["dur"] for s in spans) / 1000.0
    fig, ax = plt.subplots(figsize=(14, 1.0 + 0.75 * len(lanes)))
    for s in spans:
        cat = s.get("cat")
        x, w = s["ts"] / 1000.0, s["dur"] / 1000.0
        if cat in ("forward", "backward"):
            y = index.get((s["tid"], "layers"))
            ax.broken_barh([(x, w)], (y - 0.4, 0.8), facecolors=colours[s["name"]],
                           edgecolor="white", linewidth=0.3,
                           hatch="///" if cat == "backward" else None)
        elif cat == "ring":
            y = index.get((s["tid"], "ring"))
            phase = s["name"].rsplit(" ", 1)[0]
            ax.broken_barh([(x, w)], (y - 0.35, 0.7), facecolors=RING_COLOURS.get(phase, "grey"),
                           edgecolor="white", linewidth=0.5)
            chunk = s.get("args", {}).get("chunk")
            if chunk is not None and w > end_ms / 150:
                ax.text(x + w / 2, y, f"c{chunk}", ha="center", va="center", fontsize=6,
                        color="white")
        elif (s["tid"], "master") in index:
            y = index[(s["tid"], "master")]
            ax.broken_barh([(x, w)], (y - 0.35, 0.7), facecolors=MASTER_COLOUR)
        elif cat == "tower":
            # The tower's whole forward or backward: a thin outline under its layers.
            y = index.get((s["tid"], "layers"))
            ax.broken_barh([(x, w)], (y + 0.42, 0.08), facecolors="black")

    steps = {}
    for s in spans:
        step = s.get("args", {}).get("step")
        if step is not None:
            steps[step] = min(steps.get(step, s["ts"]), s["ts"])
    for step, ts in sorted(steps.items()):
        ax.axvline(ts / 1000.0, color="grey", linestyle="--", linewidth=0.8)
        ax.text(ts / 1000.0, -0.75, f" step {step}", fontsize=8, color="dimgrey", va="bottom")

    ax.set_yticks(range(len(lanes)))
    ax.set_yticklabels([label for _, _, label in lanes], fontsize=8)
    ax.set_ylim(len(lanes) - 0.4, -0.8)
    ax.set_xlim(0, end_ms * 1.01)
    ax.set_xlabel("ms from the first span")
    ax.grid(axis="x", linewidth=0.3)
    legend = [Patch(facecolor=c, label=n) for n, c in colours.items()]
    legend += [Patch(facecolor="white", edgecolor="black", hatch="///", label="(backward)")]
    legend += [Patch(facecolor=c, label=n) for n, c in RING_COLOURS.items()]
    if master_rows:
        legend.append(Patch(facecolor=MASTER_COLOUR, label="update + broadcast"))
    ax.legend(handles=legend, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7,
              frameon=False)
    if title:
        ax.set_title(title, fontsize=10)
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
