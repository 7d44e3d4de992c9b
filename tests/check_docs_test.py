#!/usr/bin/env python3
"""scripts/check_docs.py's own test: bad pages, pictures, numbers, phases, results and
source comments planted in a temporary tree, each of which the checker must report, and
clean ones it must accept. Standard library only.

  python3 tests/check_docs_test.py    (ctest: docs.links_self_test)
"""
import json
import os
import sys
import tempfile

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
from check_docs import Checker  # noqa: E402

CLEAN_README = ("# t\n\n[docs](docs/a.md#usage), [web](https://example.com).\n\n"
                "<!-- numbers from: r.json -->\ntowerlab ran 1.62x the best peer at 2634 images/s "
                "(abc1234, load 1.5 to 1.6, batch 128, TensorFlow 2.21).\n\n"
                "<!-- numbers from: t.json -->\nsteps of 15.9 and 16.1 ms at load 0.4 (abc1234).\n")


def self_test():
    """Each planted page must produce the problem expected; the clean tree none."""
    cases = [  # (what, appended to the README, a word the report must contain)
        ("link outside the repository", "[design](../shared/DESIGN.md)\n", "../shared"),
        ("absolute path", "[x](/etc/passwd)\n", "outside the repository"),
        ("missing file", "[x](docs/nothing.md)\n", "no such file"),
        ("missing anchor", "[x](docs/a.md#nowhere)\n", "no heading"),
        ("link that climbs out", "[x](docs/../../x.md)\n", "climbs out"),
        ("picture without its comment", "![p](docs/img/p.png)\n\n*load 1.5, towerlab abc1234*\n",
         "the line before must be"),
        ("number not in the results", "<!-- numbers from: r.json -->\nit ran 1.99x the best peer\n",
         "1.99x is not a ratio"),
        ("commit not the results'", "<!-- numbers from: r.json -->\nat commit def5678\n", "def5678"),
        ("trace step not in the trace", "<!-- numbers from: t.json -->\nsteps of 16.7 ms at load 0.4\n",
         "16.7 is not a load"),
        ("phase renamed", "1. **splitting** (`Trainer::split`): the batch.\n", "phase 1 is 'splitting'"),
        ("phase without its function", "1. **split** (`Trainer::split_it`): the batch.\n",
         "Trainer::split_it is not"),
        ("phase run by another function", "2. **guard** (`Trainer::split`): the batch.\n",
         "but Trainer::guard in parallel/trainer_phases.h"),
        ("phase the table lacks", "3. **gather** (`Trainer::split`): the rest.\n",
         "lists phases [3]; parallel/trainer_phases.h numbers [1, 2]"),
    ]
    ok = True
    with tempfile.TemporaryDirectory() as root:
        os.makedirs(os.path.join(root, "docs", "img"))
        os.makedirs(os.path.join(root, "parallel"))
        with open(os.path.join(root, "docs", "a.md"), "w") as f:
            f.write("# A\n\n## Usage\n\n1. **split** (`Trainer::split`): the batch.\n")
        trainer_h = os.path.join(root, "parallel", "trainer.h")
        with open(trainer_h, "w") as f:
            f.write("// The trainer.\n//   1. split: the batch;\n//   2. guard: the loss;\n#pragma once\n")
        with open(os.path.join(root, "parallel", "trainer_phases.h"), "w") as f:
            f.write('inline constexpr PhaseInfo kPhases[] = {\n    {Phase::Split, "split", "split"},\n'
                    '    {Phase::Guard, "guard", "guard"},\n};\n')
        with open(os.path.join(root, "parallel", "trainer.cpp"), "w") as f:
            f.write("StepResult Trainer::split(const Batch& b) {}\nbool Trainer::guard() {}\n")
        with open(os.path.join(root, "docs", "a.md"), "a") as f:
            f.write("2. **guard** (`Trainer::guard`): the loss.\n")
        with open(os.path.join(root, "r.json"), "w") as f:
            json.dump({"towerlab_commit": "abc1234", "date": "2026-11-23 18:27 UTC",
                       "versions": {"tensorflow": "2.21.0"}, "settings": {"batch": 128},
                       "summary": [{"contender": "towerlab:cpu", "median_ratio_to_best_peer": 1.62,
                                    "median_images_per_second": 2634.2, "min_images_per_second": 2000,
                                    "max_images_per_second": 2700}],
                       "rounds": [{"towerlab:cpu": {"images_per_second": 2634.2, "load_average_1min": 1.5},
                                   "tf": {"images_per_second": 1626.0, "load_average_1min": 1.6}}]}, f)
        with open(os.path.join(root, "t.json"), "w") as f:  # scripts/record_trace.py's
            json.dump({"traceEvents": [], "towerlab_commit": "abc1234", "date": "2026-11-26 10:10 UTC",
                       "load_average_1min": 0.42, "command": "fashion_mnist --devices cpu,cpu",
                       "steps": {"20": 15.9, "21": 16.1}}, f)
        readme = os.path.join(root, "README.md")
        picture = os.path.join(root, "docs", "img", "p.png")
        with open(readme, "w") as f:
            f.write(CLEAN_README)
        clean = Checker(root).run()
        if clean:
            print("self-test: the clean tree was reported:\n  " + "\n  ".join(clean))
            ok = False
        for what, planted, expected in cases:
            if "picture" in what:
                open(picture, "wb").write(b"\x89PNG")
            with open(readme, "w") as f:
                f.write(CLEAN_README + "\n" + planted)
            found = Checker(root).run()
            hit = [p for p in found if expected in p]
            print(f"self-test: planted {what}: " + (f"caught ({hit[0]})" if hit else f"NOT caught {found}"))
            ok = ok and bool(hit)
            if os.path.exists(picture):
                os.remove(picture)
        with open(readme, "w") as f:
            f.write(CLEAN_README)
        open(picture, "wb").write(b"\x89PNG")
        found = Checker(root).run()
        hit = [p for p in found if "no page shows it" in p]
        print("self-test: planted picture no page shows: " + (f"caught ({hit[0]})" if hit else "NOT caught"))
        ok = ok and bool(hit)
        os.remove(picture)
        # A GPU picture: Google Benchmark JSON, its folder's build-info.txt (the commit) and
        # summary (the device); a caption must name both, and quote only the run's numbers.
        gpu = os.path.join(root, "bench", "results", "gpu_t")
        os.makedirs(gpu)
        os.makedirs(os.path.join(root, "scripts"))
        with open(os.path.join(root, "scripts", "plots.py"), "w") as f:
            f.write('PICTURES = [("g.png", [f"gpu_t/{b}.json" for b in ("trainer_bench",)])]\n')
        with open(os.path.join(gpu, "build-info.txt"), "w") as f:
            f.write("commit: abc1234" + "0" * 33 + "\nbuilt: 2026-11-26\n")
        index = os.path.join(root, "bench", "results", "README.md")
        with open(index, "w") as f:  # the index; the folder's summaries are cited with its JSON
            f.write("# Results\n\n| [gpu_t/](gpu_t/) | the step, abc1234, H100 |\n")
        with open(os.path.join(gpu, "lease-summary.txt"), "w") as f:
            f.write("    cuda:0 (NVIDIA H100 80GB HBM3, 79 GiB, sm_90) ok\n")
        with open(os.path.join(gpu, "trainer_bench.json"), "w") as f:
            json.dump({"context": {"load_avg": [0.3]}, "benchmarks": [
                {"name": f"BM_FashionNetStep/cuda_local/{t}/128/real_time", "real_time": ms, "time_unit": "ms",
                 "items_per_second": 128e3 / ms} for t, ms in ((1, 1.016), (2, 1.123))]}, f)
        shown = "<!-- picture: docs/img/g.png from bench/results/gpu_t/trainer_bench.json by scripts/plots.py -->\n" \
                "![g](docs/img/g.png)\n\n"
        good = "*NVIDIA H100, towerlab abc1234: 1.016 ms on one tower, 1.123 ms on two, 0.90x the images/s.*\n"
        open(os.path.join(root, "docs", "img", "g.png"), "wb").write(b"\x89PNG")
        gpu_cases = [  # (what, caption, a word the report must contain; None: no problem)
            ("clean GPU caption", good, None),
            ("GPU caption with another commit", good.replace("abc1234", "def5678"), "commit def5678 is not"),
            ("GPU caption with a time the run did not give", good.replace("1.123", "1.234"), "1.234 is not a time"),
            ("GPU caption with a ratio the run did not give", good.replace("0.90x", "0.95x"), "0.95x is not a ratio"),
            ("GPU caption without the device", good.replace("NVIDIA H100, ", ""), "does not name the device"),
        ]
        for what, caption, expected in gpu_cases:
            with open(readme, "w") as f:
                f.write(CLEAN_README + "\n" + shown + caption)
            found = Checker(root).run()
            hit = [p for p in found if expected and expected in p]
            caught = not found if expected is None else bool(hit)
            print(f"self-test: {what}: " + ("accepted" if expected is None and caught else
                  f"caught ({hit[0]})" if caught else f"NOT as expected {found}"))
            ok = ok and caught
        os.remove(os.path.join(root, "docs", "img", "g.png"))
        with open(readme, "w") as f:
            f.write(CLEAN_README)
        # The header's list drifts from the table.
        with open(trainer_h, "w") as f:
            f.write("// The trainer.\n//   1. split: the batch;\n//   2. check: the loss;\n#pragma once\n")
        found = Checker(root).run()
        hit = [p for p in found if "phase 2 is 'check' here but 'guard'" in p]
        print("self-test: planted trainer.h phase renamed: " + (f"caught ({hit[0]})" if hit else f"NOT caught {found}"))
        ok = ok and bool(hit)
        with open(trainer_h, "w") as f:
            f.write("// The trainer.\n//   1. split: the batch;\n//   2. guard: the loss;\n#pragma once\n")
        # The results folder and the sources' comments. A design number in a comment (a
        # threshold, a tile, a hash constant) is not a measurement: the clean kernel has them.
        kernel = os.path.join(root, "kernels", "cuda", "k.cu")
        os.makedirs(os.path.dirname(kernel))
        clean_kernel = ("// A 128x128 tile; splits fill at least 85 % of the SMs' slots, and 0x9e3779b9\n"
                        "// mixes the seed. Its speed: bench/results/README.md.\n__global__ void k_kernel() {}\n")
        results = os.path.join(root, "bench", "results")
        planted_files = {"orphan result": ("gpu_t/raw.log", "", "gpu_t/raw.log:1: no page cites it"),
                         "result the index does not list": ("new.json", "`bench/results/new.json`\n",
                                                            "does not list new.json"),
                         "cited result that is missing": (None, "`bench/results/gone.json` has it.\n",
                                                          "names bench/results/gone.json: not in")}
        source_cases = [("Status paragraph", "// Status: ran on an H100 (abc1234: memcheck clean).\n", "'Status:'"),
                        ("percentage of cuBLAS", "/* It runs at 91 % of cuBLAS at 4096. */\n", "'91 % of cuBLAS'"),
                        ("a % slower", "// As a call it measured 8% slower.\n", "'8% slower'"),
                        ("a time", "// the step took 0.616 ms on one tower\n", "'0.616 ms'"),
                        ("a commit", "// (measured at c66a6c2)\n", "'c66a6c2'")]
        with open(kernel, "w") as f:
            f.write(clean_kernel)
        found = Checker(root).run()
        print("self-test: clean results folder and kernel comments: " + ("accepted" if not found else f"NOT accepted {found}"))
        ok = ok and not found
        for what, (planted, cite, expected) in planted_files.items():
            if planted:
                open(os.path.join(results, planted), "w").write("{}")
            with open(readme, "w") as f:
                f.write(CLEAN_README + "\n" + cite)
            found = Checker(root).run()
            hit = [p for p in found if expected in p]
            print(f"self-test: planted {what}: " + (f"caught ({hit[0]})" if hit else f"NOT caught {found}"))
            ok = ok and bool(hit)
            if planted:
                os.remove(os.path.join(results, planted))
        with open(readme, "w") as f:
            f.write(CLEAN_README)
        os.remove(index)
        found = Checker(root).run()
        hit = [p for p in found if "no index page" in p]
        print("self-test: planted results folder without its index: " + (f"caught ({hit[0]})" if hit else f"NOT caught {found}"))
        ok = ok and bool(hit)
        for what, comment, expected in source_cases:
            with open(kernel, "w") as f:
                f.write(comment + clean_kernel)
            found = Checker(root).run()
            hit = [p for p in found if "a measurement in a comment" in p and expected in p]
            print(f"self-test: planted {what} in a kernel's comment: " + (f"caught ({hit[0]})" if hit else f"NOT caught {found}"))
            ok = ok and bool(hit)
    print("self-test: " + ("passed" if ok else "FAILED"))
    return 0 if ok else 1



if __name__ == "__main__":
    sys.exit(self_test())
