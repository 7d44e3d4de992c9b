"""The results a benchmark script under bench/ writes: its JSON, a markdown table of
medians, and the results page around that table (bench/results/*.md).

A script passes its own columns, cells, introduction and notes; the shape of the
page and the order in which the files are written are decided here, once.
"""
import json
import os


def table(columns, rows):
    """A markdown table: `columns` are the header's cells, each of `rows` a list of
    cell texts."""
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def rate_cell(row):
    """A summary row's images/s as "median (min-max)", whole images."""
    return (f"{row['median_images_per_second']:.0f} ({row['min_images_per_second']:.0f}-"
            f"{row['max_images_per_second']:.0f})")


def load_averages(doc):
    """The 1-minute load average when each run of each round started."""
    return [r["load_average_1min"] for rnd in doc["rounds"] for r in rnd.values()]


def page(title, intro, table_text, notes):
    """The page: a title, the lines of `intro` (one paragraph), the table, then the
    lines of `notes`; it ends with a newline."""
    return "\n".join(["# " + title, "", *intro, "", table_text, "", *notes]) + "\n"


def write(doc, json_path, markdown_path, table_of, markdown_of):
    """Writes `doc` to `json_path`, prints table_of(doc) and, with a `markdown_path`,
    writes markdown_of(doc, json_path) there."""
    os.makedirs(os.path.dirname(os.path.abspath(json_path)), exist_ok=True)
    with open(json_path, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print(table_of(doc))
    if markdown_path:
        with open(markdown_path, "w") as f:
            f.write(markdown_of(doc, json_path))
