#!/usr/bin/env python3
"""Checks that README.md and docs/**/*.md stand on the repository alone, and that their
pictures tell the truth.

  scripts/check_docs.py [--root DIR]     check the tree (ctest docs.links)

tests/check_docs_test.py plants bad pages in a temporary tree and checks that each is caught
(ctest docs.links_self_test).

What it checks, in every page (text inside code blocks and `code spans` is not a link):
  1. Links and images: a relative target resolves to a file or folder inside the repository,
     tracked by git where the tree is a git work tree (its #anchor, into a Markdown page, to
     one of that page's headings); an absolute path, a
     file: URL or a path that climbs out of the repository is an error. Web links (http,
     https, mailto) are not checked. No page mentions ../shared or /work/ at all.
  2. Pictures: every image shown is in docs/img and is preceded by a comment
       <!-- picture: IMG from RESULTS... by SCRIPT -->
     naming existing files, the same results as the script's PICTURES list (paths there
     relative to bench/results); every file in docs/img is shown somewhere. A caption names
     the commit of its results and states the load, or, for results measured on a GPU, names
     the device ("H100") instead: there the machine's load says nothing of the kernels.
  3. Numbers: in the caption after a picture, and in the block after a comment
       <!-- numbers from: RESULTS... -->
     every ratio (1.62x, or 1.52 in a table), one-decimal value (a load), three-decimal value
     (ms), percentage (81%) and integer of three or more digits (images/s) is one the results
     files give (bench/compare_peers.py's JSON), a setting of the run, a peer's version or the
     run's date; each commit named (7 or more hex digits) begins the files' commit. A trace
     (scripts/record_trace.py's JSON) gives its commit, its load, its steps' spans in ms (one
     decimal), and the integers of its date and command. Google Benchmark JSON and
     bench/gpu_peers.py's give the commit of the build-info.txt beside them and what
     bench/gpu_report.py's rows make of them (run_facts says which numbers).
  4. Phases: the step's phases are numbered once, in kPhases of parallel/trainer_phases.h
     ({Phase::Split, "split", "split"}: number by position, name, Trainer's function).
     The list at the top of parallel/trainer.h ("//   1. split: ...") and every numbered
     list of phases in a page ("1. **split** (`Trainer::split`)") match it, number, name and
     function, and each function is defined in parallel/trainer.cpp or one of its siblings
     (parallel/trainer_*.cpp).
  5. Results: bench/results/ holds only what is cited, and its index lists it. Every file
     there is named by its path (bench/results/... in README.md or docs/, relative in a
     results page, the index bench/results/README.md among them) or drawn by scripts/plots.py
     (PICTURES); a folder's build-info.txt, *-summary.txt and README.md are cited with their
     folder (named as FOLDER/, or through a cited file in it). The index names every entry of
     bench/results/ and its links resolve; every bench/results/... path a page or results
     page mentions (in prose or code) exists.
  6. Sources: no comment in kernels/, engine/, autograd/ or parallel/ (*.cu, *.cuh, *.h,
     *.cpp) carries a measurement: a "Status:" paragraph, a percentage of cuBLAS, cuDNN,
     OpenBLAS, a peer, the copy or DRAM, a "% faster/slower", a time (us, ms, CPU-ms), a rate
     (GB/s, TB/s, TFLOP/s, images/s) or a commit hash. The comment says why the code is
     built so and points to the results (bench/results/README.md, docs/gpu.md, docs/kernels.md).
Exits 1 with one line per problem (file:line: what), 0 when the pages are clean.
"""
import argparse
import ast
import glob
import json
import os
import re
import subprocess
import sys

LINK = re.compile(r"(!?)\[((?:[^\[\]]|\[[^\]]*\])*)\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
HTML_REF = re.compile(r"""(?:src|href)\s*=\s*["']([^"']+)["']""")
PICTURE = re.compile(r"<!--\s*picture:\s*(\S+)\s+from\s+(.+?)\s+by\s+(\S+)\s*-->")
NUMBERS = re.compile(r"<!--\s*numbers from:\s*(.+?)\s*-->")
PHASE_ITEM = re.compile(r"^(\d+)\. \*\*([^*]+)\*\* \(`Trainer::(\w+)`\)")
HEADER_PHASE = re.compile(r"^//\s+(\d+)\. ([a-z][a-z ]*[a-z])\s*[:;(]")
TABLE_PHASE = re.compile(r'\{Phase::(\w+),\s*"([^"]+)",\s*"(\w+)"\}')
HEX = re.compile(r"\b[0-9a-f]{7,40}\b")
WEB = ("http://", "https://", "mailto:")
OUTSIDE = re.compile(r"\.\./shared|/work/")
RESULTS_PATH = re.compile(r"bench/results/[\w./-]*")
SOURCE_DIRS = ("kernels", "engine", "autograd", "parallel")
COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
MEASUREMENT = re.compile(
    r"\bStatus:"
    r"|\d+(?:\.\d+)?\s?%\s+of\s+(?:cuBLAS|cuDNN|OpenBLAS|PyTorch|TensorFlow|JAX|(?:the |a )?(?:device )?copy|DRAM|HBM)"
    r"|\d+(?:\.\d+)?\s?%\s+(?:faster|slower)"
    r"|\d+(?:\.\d+)?\s?(?:us|µs|ms|CPU-ms|GB/s|TB/s|GFLOP/s|TFLOP/s|images/s)(?![\w/])"
    r"|\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b")


def is_commit(word, commits):
    """A commit is named by 7 or more leading hex digits of it."""
    return len(word) >= 7 and any(c.startswith(word) for c in commits)


def device_model(name):
    """'NVIDIA H100 80GB HBM3' -> 'H100': the first word with a digit, as people name the card."""
    words = [w for w in re.split(r"[\s-]+", name) if w not in ("NVIDIA", "GeForce", "Tesla")]
    return next((w for w in words if re.search(r"\d", w)), name)


def gpu_report():
    """bench/gpu_report.py of this checkout: it pairs each GPU run with its reference, and its
    rows are what the GPU pictures draw, so they are what a caption may quote."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
    sys.dont_write_bytecode = True
    import gpu_report as report  # noqa: E402
    return report


def run_facts(path, doc, allowed):
    """Adds to allowed what a Google Benchmark JSON or bench/gpu_peers.py's JSON gives, with
    the build-info.txt of its folder (the commit) and its device (gpu_report.run_info):
    each row's % and ratio to its reference (the percentages to the unit, the ratios to two
    decimals), times in us (one decimal) and ms (three), images/s and GB/s to the unit,
    TB/s to one decimal, the ratios between the rows of one batch, and the integers of the
    benchmarks' names. Returns a problem, or None."""
    report = gpu_report()
    info = report.run_info(os.path.dirname(path))
    if not info["commit"]:
        return "no build-info.txt beside it names the commit"
    allowed["commit"].add(info["commit"])
    if info["device"]:
        allowed["device"].add(device_model(info["device"]))
    elif doc.get("context", {}).get("load_avg"):
        allowed["one"].add(f"{doc['context']['load_avg'][0]:.1f}")
    for run in doc.get("benchmarks", []):
        allowed["int"].update(re.findall(r"\d{3,}", run["name"]))
        if "items_per_second" in run:
            allowed["int"].add(f"{run['items_per_second']:.0f}")
    if "torch" in doc:
        allowed["ratio"].add(".".join(doc["torch"].split(".")[:2]))
    rows = report.rows_of(path)
    for r in rows:
        if hasattr(r, "ratio"):
            allowed["pct"].add(f"{100 * r.ratio:.0f}")
            allowed["ratio"].add(f"{r.ratio:.2f}")
        if isinstance(r, report.Pair):
            allowed["one"].update({f"{r.us:.1f}", f"{r.ref_us:.1f}"})
            if r.target:
                allowed["pct"].add(f"{100 * r.target:.0f}")
        elif isinstance(r, report.Ring):
            allowed["pct"].add("80")
            allowed["int"].update({f"{r.mem / 1e9:.0f}", f"{r.copy_mem / 1e9:.0f}"})
            allowed["one"].update({f"{r.mem / 1e12:.1f}", f"{r.copy_mem / 1e12:.1f}"})
            allowed["int"].add(str(r.size >> 20))
            allowed["one"].update({f"{r.us:.1f}", f"{r.copy_us:.1f}"})
        else:  # a training step: trainer_bench's or gpu_peers.py's
            allowed["three"].add(f"{r.ms:.3f}")
            allowed["int"].update({str(r.batch), f"{r.images_per_second:.0f}"})
            allowed["int"].update(f"{v:.0f}" for v in getattr(r, "rounds", []))
            for o in rows:
                if o.batch == r.batch and o is not r:
                    allowed["ratio"].add(f"{r.images_per_second / o.images_per_second:.2f}")
    return None


def pages(root):
    found = [os.path.join(root, "README.md")] if os.path.exists(os.path.join(root, "README.md")) else []
    for top, dirs, files in os.walk(os.path.join(root, "docs")):
        dirs.sort()
        found += [os.path.join(top, f) for f in sorted(files) if f.endswith(".md")]
    return found


def prose_lines(text):
    """(line number, line) outside fenced code blocks, with `code spans` blanked."""
    fenced = False
    for n, line in enumerate(text.split("\n"), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            yield n, re.sub(r"`[^`]*`", lambda m: " " * len(m.group(0)), line)


def slug(heading):
    """GitHub's anchor for a heading."""
    s = heading.strip().lower()
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def anchors(path):
    fenced, out = False, set()
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.lstrip().startswith("```"):
                fenced = not fenced
            elif not fenced and re.match(r"#{1,6} ", line):
                out.add(slug(line.lstrip("#")))
    return out


class Checker:
    def __init__(self, root):
        self.root = os.path.realpath(root)
        self.problems = []
        self.phases = None  # parallel/trainer_phases.h's table, read once (phase_table)
        self.tracked = self.git_files()

    def git_files(self):
        """The files git tracks (and their folders), or None outside a git work tree: a link
        to a file that exists here but is not tracked is missing from a fresh clone."""
        try:
            out = subprocess.run(["git", "-C", self.root, "ls-files", "-z"], capture_output=True,
                                 check=True).stdout.decode("utf-8", "replace")
        except (OSError, subprocess.CalledProcessError):
            return None
        files = set()
        for rel in filter(None, out.split("\0")):
            path = os.path.join(self.root, rel)
            files.add(path)
            while (path := os.path.dirname(path)) != self.root and path not in files:
                files.add(path)
        files.add(self.root)
        return files

    def fail(self, path, line, what):
        self.problems.append(f"{os.path.relpath(path, self.root)}:{line}: {what}")

    def inside(self, path):
        real = os.path.realpath(path)
        return real == self.root or real.startswith(self.root + os.sep)

    # --- 1. links -------------------------------------------------------------
    def check_target(self, page, n, target):
        if not target or target.startswith(WEB):
            return
        if target.startswith("/") or re.match(r"^[a-zA-Z][\w+.-]*:", target):
            self.fail(page, n, f"link to {target}: outside the repository (use a relative path to a file in it)")
            return
        path, _, anchor = target.partition("#")
        dest = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
        if not self.inside(dest):
            self.fail(page, n, f"link to {target}: climbs out of the repository")
        elif not os.path.exists(dest):
            self.fail(page, n, f"link to {target}: no such file in the repository")
        elif self.tracked is not None and os.path.realpath(dest) not in self.tracked and os.path.realpath(page) in self.tracked:
            self.fail(page, n, f"link to {target}: not tracked by git, so a fresh clone lacks it (git add it)")
        elif anchor and dest.endswith(".md") and anchor not in anchors(dest):
            self.fail(page, n, f"link to {target}: {os.path.relpath(dest, self.root)} has no heading #{anchor}")

    def check_links(self, page, text):
        for n, line in enumerate(text.split("\n"), 1):
            if OUTSIDE.search(line):
                self.fail(page, n, f"mentions {OUTSIDE.search(line).group(0)}: the pages may refer only to what the repository holds")
        for n, line in prose_lines(text):
            for m in LINK.finditer(line):
                self.check_target(page, n, m.group(3))
            for m in HTML_REF.finditer(line):
                self.check_target(page, n, m.group(1))

    # --- 2 and 3. pictures and their numbers --------------------------------------
    def plotted(self):
        """The PICTURES list of scripts/plots.py: {picture name: [results file names]}."""
        path = os.path.join(self.root, "scripts", "plots.py")
        if not os.path.exists(path):
            return {}
        tree = ast.parse(open(path, encoding="utf-8").read())
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "PICTURES" for t in node.targets):
                # Only the list's expression runs, without builtins: a picture's files may be
                # written as a comprehension over one results folder, so that redrawing it
                # from a newer folder changes one line.
                value = eval(compile(ast.Expression(node.value), path, "eval"), {"__builtins__": {}})
                return {name: files for name, files in value}
        return {}

    def facts(self, page, n, files):
        """What the results files allow a text to quote, or None after reporting a problem."""
        allowed = {k: set() for k in ("ratio", "one", "three", "int", "pct", "commit", "device")}
        for rel in files:
            path = os.path.normpath(os.path.join(os.path.dirname(page), rel))
            if not self.inside(path) or not os.path.exists(path):
                self.fail(page, n, f"results file {rel}: not in the repository")
                return None
            try:
                doc = json.load(open(path, encoding="utf-8"))
                if "traceEvents" in doc:  # scripts/record_trace.py's
                    allowed["commit"].add(doc["towerlab_commit"])
                    allowed["one"].add(f"{doc['load_average_1min']:.1f}")
                    allowed["one"].update(f"{ms:.1f}" for ms in doc["steps"].values())
                    allowed["int"].update(re.findall(r"\d{3,}", doc["date"]))
                    allowed["int"].update(re.findall(r"\d{3,}", doc["command"]))
                    continue
                if "benchmarks" in doc or "seconds_per_step" in doc:  # Google Benchmark's, gpu_peers.py's
                    problem = run_facts(path, doc, allowed)
                    if problem:
                        self.fail(page, n, f"results file {rel}: {problem}")
                        return None
                    continue
                summary, rounds = doc["summary"], doc["rounds"]
            except (ValueError, KeyError, TypeError) as e:
                self.fail(page, n, f"results file {rel}: not bench/compare_peers.py's, "
                                   f"scripts/record_trace.py's, Google Benchmark's or bench/gpu_peers.py's "
                                   f"JSON ({e!r})")
                return None
            allowed["commit"].add(doc["towerlab_commit"])
            for row in summary:
                allowed["ratio"].add(f"{row['median_ratio_to_best_peer']:.2f}")
                for key in ("median_images_per_second", "min_images_per_second",
                            "max_images_per_second", "median_images_per_cpu_second"):
                    if row.get(key) is not None:
                        allowed["int"].add(str(round(row[key])))
            peers = [c for c in rounds[0] if not c.startswith("towerlab")]
            loads = []
            for rnd in rounds:
                best = max(rnd[p]["images_per_second"] for p in peers)
                for c, run in rnd.items():
                    allowed["ratio"].add(f"{run['images_per_second'] / best:.2f}")
                    allowed["int"].add(str(round(run["images_per_second"])))
                    loads.append(run["load_average_1min"])
            loads.sort()
            for value in (loads[0], loads[-1], loads[len(loads) // 2]):
                allowed["one"].add(f"{value:.1f}")
            for v in doc.get("versions", {}).values():
                allowed["ratio"].add(".".join(v.split(".")[:2]))
                allowed["one"].add(".".join(v.split(".")[:2]))
            for v in doc.get("settings", {}).values():
                allowed["int"].add(str(v))
            allowed["int"].update(re.findall(r"\d{3,}", doc.get("date", "")))
        return allowed

    def check_numbers(self, page, start, lines, allowed, what):
        token = re.compile(r"(?<![\w.\-/])(\d+(?:\.\d+)?)(x|%)?(?![\w\-/]|\.\d)")
        for n, line in lines:
            for word in HEX.findall(line):
                if re.search(r"[a-f]", word) and re.search(r"\d", word) and not is_commit(word, allowed["commit"]):
                    self.fail(page, n, f"{what}: commit {word} is not the results' ({', '.join(sorted(allowed['commit']))})")
            for m in token.finditer(line):
                number, x = m.group(1), m.group(2) or ""
                decimals = len(number.split(".")[1]) if "." in number else 0
                if x == "%" and decimals == 0:
                    if number not in allowed["pct"]:
                        self.fail(page, n, f"{what}: {number}% is not a percentage of the results files")
                elif decimals == 3 and number not in allowed["three"]:
                    self.fail(page, n, f"{what}: {number} is not a time in ms of the results files")
                elif decimals == 2 and number not in allowed["ratio"]:
                    self.fail(page, n, f"{what}: {number}{x} is not a ratio of the results files")
                elif decimals == 1 and number not in allowed["one"]:
                    self.fail(page, n, f"{what}: {number} is not a load or version of the results files")
                elif decimals == 0 and len(number) >= 3 and number not in allowed["int"]:
                    self.fail(page, n, f"{what}: {number} is not a value of the results files")

    def block_after(self, lines, i, skip_images=False):
        """The paragraph (or table) that starts at the first non-blank line after index i."""
        j = i + 1
        while j < len(lines) and (not lines[j][1].strip() or (skip_images and lines[j][1].lstrip().startswith("!["))):
            j += 1
        block = []
        while j < len(lines) and lines[j][1].strip():
            block.append(lines[j])
            j += 1
        return block

    def check_pictures(self, page, text, shown):
        plotted = self.plotted()
        lines = list(prose_lines(text))
        for i, (n, line) in enumerate(lines):
            for m in LINK.finditer(line):
                if m.group(1) != "!" or m.group(3).startswith(WEB):
                    continue
                target = os.path.normpath(os.path.join(os.path.dirname(page), m.group(3)))
                shown.add(target)
                name = os.path.basename(target)
                if os.path.dirname(target) != os.path.join(self.root, "docs", "img"):
                    self.fail(page, n, f"picture {m.group(3)}: pictures live in docs/img")
                comment = PICTURE.search(text.split("\n")[n - 2]) if n >= 2 else None
                if not comment or os.path.normpath(os.path.join(os.path.dirname(page), comment.group(1))) != target:
                    self.fail(page, n, f"picture {m.group(3)}: the line before must be "
                                       f"<!-- picture: {m.group(3)} from RESULTS... by SCRIPT -->")
                    continue
                results = comment.group(2).split()
                script = os.path.normpath(os.path.join(os.path.dirname(page), comment.group(3)))
                if not os.path.exists(script):
                    self.fail(page, n - 1, f"picture {name}: script {comment.group(3)} not in the repository")
                drawn_from = sorted(os.path.join(self.root, "bench", "results", f) for f in plotted.get(name, []))
                if sorted(os.path.normpath(os.path.join(os.path.dirname(page), r)) for r in results) != drawn_from:
                    self.fail(page, n - 1, f"picture {name}: drawn from {plotted.get(name)} (in bench/results) by "
                                           f"scripts/plots.py (PICTURES), but the comment names {results}")
                allowed = self.facts(page, n - 1, results)
                caption = self.block_after(lines, i, skip_images=True)
                if allowed is None:
                    continue
                if not caption:
                    self.fail(page, n, f"picture {name}: no caption after it")
                    continue
                said = " ".join(l for _, l in caption)
                if allowed["device"]:  # on a GPU the machine's load says nothing of the kernels' speed
                    if not any(d in said for d in allowed["device"]):
                        self.fail(page, caption[0][0], f"picture {name}: the caption does not name the device "
                                                       f"({', '.join(sorted(allowed['device']))})")
                elif "load" not in said:
                    self.fail(page, caption[0][0], f"picture {name}: the caption does not state the load")
                if not any(is_commit(word, allowed["commit"]) for word in HEX.findall(said)):
                    self.fail(page, caption[0][0], f"picture {name}: the caption does not name the commit "
                                                   f"{', '.join(sorted(allowed['commit']))}")
                self.check_numbers(page, caption[0][0], caption, allowed, f"caption of {name}")
        for idx, (n, line) in enumerate(lines):
            m = NUMBERS.search(line)  # code spans are blanked: a comment quoted in code is not one
            if not m:
                continue
            allowed = self.facts(page, n, m.group(1).split())
            block = self.block_after(lines, idx)
            if not block:
                self.fail(page, n, "a numbers comment with nothing after it")
            elif allowed is not None:
                self.check_numbers(page, n, block, allowed, "numbers")

    # --- 4. the trainer's phases -------------------------------------------------
    def phase_table(self):
        """{number: (name, function)} from kPhases in parallel/trainer_phases.h, after checking
        that the list at the top of parallel/trainer.h agrees with it; None when missing."""
        if self.phases is not None:
            return self.phases or None
        self.phases = {}
        table = os.path.join(self.root, "parallel", "trainer_phases.h")
        header = os.path.join(self.root, "parallel", "trainer.h")
        if not os.path.exists(table) or not os.path.exists(header):
            return None
        text = open(table, encoding="utf-8").read()
        start = text.find("kPhases[]")
        rows = TABLE_PHASE.findall(text[start:]) if start >= 0 else []
        if not rows:
            self.fail(table, 1, "holds no kPhases table ({Phase::Split, \"split\", \"split\"}, ...)")
            return None
        self.phases = {i: (name, function) for i, (_, name, function) in enumerate(rows, 1)}
        listed = {}
        with open(header, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if not line.startswith("//"):
                    break
                m = HEADER_PHASE.match(line)
                if m:
                    listed[int(m.group(1))] = (n, m.group(2).strip())
        if sorted(listed) != sorted(self.phases):
            self.fail(header, 1, f"its list numbers phases {sorted(listed)}; "
                                 f"parallel/trainer_phases.h numbers {sorted(self.phases)}")
        for number, (n, name) in sorted(listed.items()):
            if number in self.phases and self.phases[number][0] != name:
                self.fail(header, n, f"phase {number} is '{name}' here but "
                                     f"'{self.phases[number][0]}' in parallel/trainer_phases.h")
        return self.phases

    def check_phases(self, page, text):
        items = [(n, PHASE_ITEM.match(line)) for n, line in enumerate(text.split("\n"), 1)]
        items = [(n, m) for n, m in items if m]
        if not items:
            return
        phases = self.phase_table()
        source = os.path.join(self.root, "parallel", "trainer.cpp")
        siblings = sorted(glob.glob(os.path.join(self.root, "parallel", "trainer_*.cpp")))
        if phases is None or not os.path.exists(source):
            self.fail(page, items[0][0], "names the trainer's phases, but parallel/trainer_phases.h, "
                                         "trainer.h or trainer.cpp is missing")
            return
        code = "".join(open(f, encoding="utf-8").read() for f in [source] + siblings)
        numbers = [int(m.group(1)) for _, m in items]
        if sorted(numbers) != sorted(phases):
            self.fail(page, items[0][0], f"lists phases {numbers}; parallel/trainer_phases.h numbers {sorted(phases)}")
        for n, m in items:
            number, name, function = int(m.group(1)), m.group(2), m.group(3)
            if number not in phases:
                continue  # reported above
            expected_name, expected_function = phases[number]
            if expected_name != name:
                self.fail(page, n, f"phase {number} is '{name}' here but '{expected_name}' in parallel/trainer_phases.h")
            elif expected_function != function:
                self.fail(page, n, f"phase {number} runs Trainer::{function} here but Trainer::{expected_function} "
                                   f"in parallel/trainer_phases.h")
            if not re.search(rf"\bTrainer::{function}\(", code):
                self.fail(page, n, f"Trainer::{function} is not in parallel/trainer.cpp or trainer_*.cpp")

    # --- 5. the results folder ---------------------------------------------------
    def results_files(self, results):
        """The files in bench/results (tracked by git where the tree is a git work tree)."""
        found = []
        for top, dirs, files in os.walk(results):
            dirs.sort()
            found += [os.path.join(top, f) for f in sorted(files)
                      if self.tracked is None or os.path.join(top, f) in self.tracked]
        return found

    def check_results(self):
        results = os.path.join(self.root, "bench", "results")
        if not os.path.isdir(results):
            return
        index = os.path.join(results, "README.md")
        files = [f for f in self.results_files(results) if f != index]
        result_pages = [f for f in self.results_files(results) if f.endswith(".md")]
        texts = {page: open(page, encoding="utf-8").read() for page in pages(self.root) + result_pages}
        for page, text in texts.items():  # every bench/results/... a page names exists
            for n, line in enumerate(text.split("\n"), 1):
                for m in RESULTS_PATH.finditer(line):
                    named = m.group(0).rstrip(".")
                    if line[m.end():m.end() + 1] in ("<", "{", "*") or re.search(r"[A-Z]{2,}", named):
                        continue  # a pattern (gpu_h100_<commit>/, trace_COMMIT.json), not a file
                    if not os.path.exists(os.path.join(self.root, named)):
                        self.fail(page, n, f"names {named}: not in the repository (a dropped result? "
                                           f"cite one that holds the number, or name the commit)")

        def named(path, page, text):
            """Whether text names path: from the root (bench/results/...) or, in a results
            page, relative to the page's folder."""
            names = [os.path.relpath(path, self.root)]
            if page.startswith(results + os.sep):
                names.append(os.path.relpath(path, os.path.dirname(page)))
            return any(re.search(r"(?<![\w.-])" + re.escape(name) + r"(?![\w-])", text) for name in names)

        drawn = {os.path.join(results, f) for fs in self.plotted().values() for f in fs}
        cited = {f for f in files if f in drawn or any(named(f, p, t) for p, t in texts.items())}
        folders = {os.path.dirname(f) for f in cited}
        folders |= {d for d in {os.path.dirname(f) for f in files}
                    if any(named(d + "/", p, t) for p, t in texts.items())}
        for f in files:
            base = os.path.basename(f)
            tie = base in ("build-info.txt", "README.md") or base.endswith("-summary.txt")
            if f not in cited and not (tie and os.path.dirname(f) in folders):
                self.fail(f, 1, "no page cites it (by its path, in README.md, docs/, a results page "
                                "or bench/results/README.md, or in scripts/plots.py's PICTURES): git rm "
                                "it (the history keeps it), or cite it")
        if not os.path.exists(index):
            self.fail(results, 1, "no index page (bench/results/README.md listing each result: "
                                  "commit, machine, date, the page that cites it)")
            return
        text = texts.get(index) or open(index, encoding="utf-8").read()
        self.check_links(index, text)
        for entry in sorted(os.listdir(results)):
            path = os.path.join(results, entry)
            if path == index or (self.tracked is not None and path not in self.tracked):
                continue
            if not re.search(r"(?<![\w.-])" + re.escape(entry) + r"(?![\w-])", text):
                self.fail(index, 1, f"does not list {entry}" + ("/" if os.path.isdir(path) else "") +
                                    ": the index names every file and folder of bench/results")

    # --- 6. no measurements in source comments -------------------------------------
    def check_sources(self):
        for top in SOURCE_DIRS:
            for folder, dirs, files in os.walk(os.path.join(self.root, top)):
                dirs.sort()
                for name in sorted(files):
                    path = os.path.join(folder, name)
                    if not name.endswith((".cu", ".cuh", ".h", ".cpp")) or \
                            (self.tracked is not None and path not in self.tracked):
                        continue
                    text = open(path, encoding="utf-8").read()
                    for comment in COMMENT.finditer(text):
                        for m in MEASUREMENT.finditer(comment.group(0)):
                            n = text.count("\n", 0, comment.start() + m.start()) + 1
                            self.fail(path, n, f"a measurement in a comment ('{m.group(0)}'): say why the "
                                               f"code is built so and point to the results "
                                               f"(bench/results/README.md, docs/gpu.md, docs/kernels.md)")

    def run(self):
        shown = set()
        for page in pages(self.root):
            text = open(page, encoding="utf-8").read()
            self.check_links(page, text)
            self.check_pictures(page, text, shown)
            self.check_phases(page, text)
        self.check_results()
        self.check_sources()
        img = os.path.join(self.root, "docs", "img")
        if os.path.isdir(img):
            for f in sorted(os.listdir(img)):
                if os.path.join(img, f) not in shown:
                    self.problems.append(f"docs/img/{f}: no page shows it (remove it, or show it with its caption)")
        return self.problems


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    args = p.parse_args()
    problems = Checker(args.root).run()
    for line in problems:
        print(line)
    if problems:
        print(f"check_docs: {len(problems)} problem(s) in README.md and docs/ "
              "(scripts/check_docs.py says what each check wants)")
        return 1
    print(f"check_docs: {len(pages(args.root))} pages, their links, pictures and numbers are fine")
    return 0


if __name__ == "__main__":
    sys.exit(main())
