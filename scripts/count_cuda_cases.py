#!/usr/bin/env python3
"""Counts the CUDA cases of one ctest run on the emulated GPUs, and fails if any was
skipped: on emulated GPUs every CUDA case can run, so a skip hides a case.

  count_cuda_cases.py JUNIT_XML    (ctest --output-junit JUNIT_XML)

A CUDA case is one whose name says so: a test instance on cuda:N (/cuda0), a
Cuda*/NCCL/GPU test, the emulator's own tests and its controls; not the /cpu
instance of a typed test.
"""
import re
import sys
import xml.etree.ElementTree as ET

CUDA = re.compile(r"cuda|nccl|gpu|emulat", re.IGNORECASE)


def main():
    cases = ET.parse(sys.argv[1]).getroot().iter("testcase")
    counts = {"run": 0, "passed": 0, "failed": 0, "skipped": 0}
    skipped = []
    total = 0
    for case in cases:
        total += 1
        name = case.get("name", "").split("  #")[0]  # ctest appends "  # GetParam() = ..."
        if not CUDA.search(name) or name.endswith("/cpu"):
            continue  # not a CUDA case, or the CPU instance of one (which may skip)
        status = case.get("status", "run")
        if case.find("skipped") is not None or status in ("disabled", "notrun"):
            counts["skipped"] += 1
            skipped.append(name)
        elif case.find("failure") is not None or case.find("error") is not None or status == "fail":
            counts["failed"] += 1
        else:
            counts["passed"] += 1
    counts["run"] = counts["passed"] + counts["failed"]
    print("CUDA cases on the emulated GPUs: %(run)d ran (%(passed)d passed, %(failed)d failed), "
          "%(skipped)d skipped" % counts + " (of %d cases in all)" % total)
    if skipped:
        print("a CUDA case skipped on the emulated GPUs (each must run):")
        for name in skipped:
            print("  " + name)
        return 1
    return 1 if counts["run"] == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
