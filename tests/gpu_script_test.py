#!/usr/bin/env python3
"""The GPU script's judge and summaries (scripts/gpu_judge.py) and its commands' parsing
(scripts/gpu.py), on crafted gtest reports, logs and bench JSON: a passing shard, an
unexplained skip, a crash with no report, a time-out, a failing case; the shards, the
deadlines, the sizes against the 64 MiB limit. Standard library only.

  python3 tests/gpu_script_test.py    (ctest: gpu_script.unit)
"""
import gzip
import json
import os
import struct
import sys
import tempfile
import unittest

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
import gpu  # noqa: E402
import gpu_judge as judge  # noqa: E402


def report(*cases):
    """A gtest XML report of (classname, name, body) cases; body is the inner XML."""
    rows = "".join(f'<testcase name="{n}" status="run" result="completed" classname="{c}">{b}</testcase>'
                   for c, n, b in cases)
    return f'<?xml version="1.0"?><testsuites><testsuite name="s">{rows}</testsuite></testsuites>'


SKIP = '<skipped message="tests/x.cpp:10&#x0A;{0}"><![CDATA[tests/x.cpp:10\n{0}]]></skipped>'
FAIL = '<failure message="boom"><![CDATA[tests/x.cpp:20\nExpected equality of these values:\n  1\n  2]]></failure>'


class Judge(unittest.TestCase):
    def test_a_passing_shard_passes(self):
        ok, lines = judge.judge_shard("cuda-kernels", ["A.b", "A.c"], report(("A", "b", ""), ("A", "c", "")), "")
        self.assertTrue(ok)
        self.assertEqual(lines, ["  cuda-kernels: 2 cases: 2 passed, 0 failed, 0 skipped (0 expected, "
                                 "0 UNEXPECTED), 0 not run"])

    def test_an_explained_skip_passes_and_is_labelled(self):
        xml = report(("A", "b", ""), ("Ring", "ThreeWay", SKIP.format("needs three CUDA devices")),
                     ("Backends/ReluTest", "Fwd/cpu", SKIP.format("CUDA-only: the stream's event")))
        ok, lines = judge.judge_shard("cpu", ["A.b", "Ring.ThreeWay", "Backends/ReluTest.Fwd/cpu"], xml, "")
        self.assertTrue(ok, lines)
        self.assertIn("2 skipped (2 expected, 0 UNEXPECTED)", lines[0])
        self.assertIn("    skipped 1, expected (three GPUs): needs three CUDA devices (e.g. Ring.ThreeWay)", lines)
        self.assertIn("expected (CPU instance)", "\n".join(lines))

    def test_an_unexplained_skip_fails(self):
        xml = report(("A", "b", ""), ("Backends/MatmulTest", "Fwd/cuda0", SKIP.format("no CUDA device")))
        ok, lines = judge.judge_shard("cuda-kernels", ["A.b", "Backends/MatmulTest.Fwd/cuda0"], xml, "")
        self.assertFalse(ok)
        self.assertIn("1 skipped (0 expected, 1 UNEXPECTED)", lines[0])
        self.assertIn("    skipped 1, UNEXPECTED: no CUDA device (e.g. Backends/MatmulTest.Fwd/cuda0)", lines)

    def test_an_expected_message_on_the_wrong_case_fails(self):
        # "CUDA-only" explains a CPU instance only; on a CUDA instance it means the case did not run.
        xml = report(("Backends/ReluTest", "Fwd/cuda0", SKIP.format("CUDA-only: x")))
        ok, lines = judge.judge_shard("cuda-kernels", ["Backends/ReluTest.Fwd/cuda0"], xml, "")
        self.assertFalse(ok)
        self.assertIn("UNEXPECTED: CUDA-only: x", "\n".join(lines))

    def test_a_failing_case_fails_with_its_message(self):
        xml = report(("A", "b", ""), ("A", "c", FAIL))
        ok, lines = judge.judge_shard("cpu", ["A.b", "A.c"], xml, "")
        self.assertFalse(ok)
        self.assertIn("1 passed, 1 failed", lines[0])
        self.assertIn("    FAILED A.c: Expected equality of these values: 1 2", lines)

    def test_a_failure_outside_any_test_fails(self):
        xml = report(("A", "b", ""), ("", "", FAIL))
        ok, lines = judge.judge_shard("cpu", ["A.b"], xml, "")
        self.assertFalse(ok)
        self.assertIn("    FAILED (outside any test): Expected equality of these values: 1 2", lines)

    def test_a_case_that_did_not_run_fails(self):
        ok, lines = judge.judge_shard("cpu", ["A.b", "A.gone"], report(("A", "b", "")), "")
        self.assertFalse(ok)
        self.assertIn("1 not run", lines[0])
        self.assertIn("    NOT RUN A.gone", lines)

    def test_a_crash_with_no_report_names_the_running_case(self):
        log = ("[ RUN      ] A.b\n[       OK ] A.b (1 ms)\n[ RUN      ] A.c\n"
               "Segmentation fault (core dumped)\n")
        ok, lines = judge.judge_shard("cuda-training", ["A.b", "A.c"], None, log)
        self.assertFalse(ok)
        self.assertEqual(lines, ["  cuda-training: 2 cases, NO REPORT (a crash or a time-out; OSError); "
                                 "it was running A.c"])

    def test_a_time_out_cut_report_fails(self):
        # A process killed while writing leaves a truncated report.
        log = "[ RUN      ] Nccl.AllReduce\n"
        ok, lines = judge.judge_shard("cuda-nccl", ["Nccl.AllReduce"], "<testsuites><testsuite", log)
        self.assertFalse(ok)
        self.assertIn("NO REPORT (a crash or a time-out; ParseError); it was running Nccl.AllReduce", lines[0])

    def test_a_crash_after_the_last_case_names_none(self):
        self.assertIsNone(judge.last_started("[ RUN      ] A.b\n[  SKIPPED ] A.b (0 ms)\n"))
        self.assertEqual(judge.last_started("[ RUN      ] A.b\n[  FAILED  ] A.b (0 ms)\n[ RUN      ] A.c\n"), "A.c")

    def test_an_empty_report_fails(self):
        ok, _ = judge.judge_shard("cpu", [], report(), "")
        self.assertFalse(ok)

    def test_expected_skips(self):
        self.assertEqual(judge.expected_skip("needs 2 GPU(s) for as many NCCL ranks; 1 visible",
                                           "NcclTest.AllReduce"), "two GPUs")
        self.assertIsNone(judge.expected_skip("needs 2 GPU(s) for as many NCCL ranks; 1 visible", "Ring.AllReduce"))
        self.assertIsNone(judge.expected_skip("this build of towerlab has no NCCL", "NcclTest.AllReduce"))
        self.assertEqual(judge.expected_skip("this CPU has no AVX-512", "Conv2dWinograd.Avx512GivesTheAvx2Bits"),
                         "CPU without AVX-512")


class Shards(unittest.TestCase):
    LISTING = """Backends/MatmulTest.
  Forward/cpu  # GetParam() = cpu
  Forward/cuda0  # GetParam() = cuda0
  DISABLED_Slow/cuda0
Trainer.
  TwoTowers
NcclTest.
  AllReduce
Conv2dWinogradCuda.
  OnLargeLayers
  Small
Tape.
  Backward
"""

    def test_every_case_is_in_one_shard(self):
        cases = judge.parse_test_list(self.LISTING)
        self.assertEqual(cases, ["Backends/MatmulTest.Forward/cpu", "Backends/MatmulTest.Forward/cuda0",
                                 "Trainer.TwoTowers", "NcclTest.AllReduce", "Conv2dWinogradCuda.OnLargeLayers",
                                 "Conv2dWinogradCuda.Small", "Tape.Backward"])
        shards = judge.shard_cases(cases)
        self.assertEqual(shards["cuda-kernels"], ["Backends/MatmulTest.Forward/cuda0", "Conv2dWinogradCuda.OnLargeLayers",
                                                  "Conv2dWinogradCuda.Small"])
        self.assertEqual(shards["cuda-training"], ["Trainer.TwoTowers"])
        self.assertEqual(shards["cuda-nccl"], ["NcclTest.AllReduce"])
        self.assertEqual(shards["cpu"], ["Backends/MatmulTest.Forward/cpu", "Tape.Backward"])
        self.assertEqual(shards["memcheck"], ["Backends/MatmulTest.Forward/cuda0", "Conv2dWinogradCuda.Small"])
        self.assertEqual(shards["racecheck"], shards["memcheck"])
        self.assertEqual(judge.shards_line(shards), "cases: 7 in the test binary: cuda-kernels 3, cuda-training 1, "
                         "cuda-nccl 1, cpu 2; memcheck 2, racecheck and synccheck 2")

    def test_an_empty_shard_has_no_filter_and_a_huge_one_is_refused(self):
        self.assertIsNone(judge.gtest_filter([], "cuda-nccl"))
        self.assertEqual(judge.gtest_filter(["A.b", "A.c"], "cpu"), "A.b:A.c")
        with self.assertRaisesRegex(judge.Failed, "the cpu filter is 120000 characters"):
            judge.gtest_filter(["x" * 59999, "y" * 60000], "cpu")


class Deadlines(unittest.TestCase):
    def test_a_step_gets_what_is_left_less_the_packing(self):
        self.assertEqual(judge.step_limit(100, 540), 100)
        self.assertEqual(judge.step_limit(100, 90), 60)
        self.assertEqual(judge.step_limit(100, 40), 10)
        self.assertIsNone(judge.step_limit(100, 39))

    def test_benches_leave_what_the_later_steps_keep(self):
        # measure keeps 350 s for the peers and FashionNet, lease 140 s.
        self.assertEqual(judge.bench_limit(540, 350), 60)
        self.assertEqual(judge.bench_limit(380, 350), 30)
        self.assertIsNone(judge.bench_limit(359, 350))
        self.assertEqual(judge.bench_limit(100, 0), 60)

    def test_a_time_out_and_a_kill_read_as_a_time_out(self):
        self.assertEqual(judge.step_line("cpu", 124, 120, 130), (124, "cpu: TIMED OUT after 120s"))
        self.assertEqual(judge.step_line("cpu", 137, 120, 131), (124, "cpu: TIMED OUT after 120s"))
        self.assertEqual(judge.step_line("cpu", 1, 120, 7), (1, "cpu: exit 1, 7s"))

    def test_a_step_past_its_limit_is_cut(self):
        with tempfile.TemporaryFile() as log:
            self.assertEqual(gpu.run_with_limit(["sleep", "30"], 1, log), 124)
            self.assertEqual(gpu.run_with_limit(["sh", "-c", "echo hi; exit 3"], 10, log), 3)
            self.assertEqual(gpu.run_with_limit(["sh", "-c", "kill -9 $$"], 10, log), 137)
            log.seek(0)
            self.assertEqual(log.read(), b"hi\n")

    def test_the_verdict(self):
        self.assertEqual(judge.verdict_lines("lease", 0, 400), ["lease: PASSED", "lease took 400s"])
        self.assertEqual(judge.verdict_lines("lease", 3, 5)[0], "lease: FAILED (exit 3; see above)")


class Summaries(unittest.TestCase):
    def test_bench_summary(self):
        ok, lines = judge.bench_summary(json.dumps({"benchmarks": [{"name": "a"}, {"name": "b"}]}))
        self.assertTrue(ok)
        self.assertEqual(lines, ["  2 benchmarks, 0 with an error"])
        ok, lines = judge.bench_summary(json.dumps({"benchmarks": [
            {"name": "a"}, {"name": "b", "error_occurred": True, "error_message": "out of memory"}]}))
        self.assertFalse(ok)
        self.assertEqual(lines, ["  2 benchmarks, 1 with an error", "  error: b: out of memory"])
        self.assertFalse(judge.bench_summary(json.dumps({"benchmarks": []}))[0])
        self.assertEqual(judge.bench_summary(None), (False, ["  no readable results (FileNotFoundError): FAILED"]))
        self.assertEqual(judge.bench_summary('{"context": {}}'), (False, ["  no readable results (KeyError): FAILED"]))
        self.assertEqual(judge.bench_summary('{"bench'), (False, ["  no readable results (JSONDecodeError): FAILED"]))

    def test_ab_table(self):
        def runs(*times):
            return json.dumps({"benchmarks": [{"name": f"BM_X/{i}/manual_time", "real_time": t, "time_unit": "us"}
                                              for i, t in enumerate(times)]})
        ok, lines = judge.ab_table({"ab-conv2d_bench-head-1.json": runs(10, 20), "ab-conv2d_bench-head-2.json": runs(12, 20),
                                  "ab-conv2d_bench-abc1234-1.json": runs(22, 10)}, ["head", "abc1234"])
        self.assertTrue(ok)
        self.assertEqual(lines, ["  case | head | abc1234 | abc1234 / head",
                                 "  BM_X/0 (us) | 10.0 / 12.0 | 22.0 | 2.000",
                                 "  BM_X/1 (us) | 20.0 / 20.0 | 10.0 | 0.500"])
        self.assertEqual(judge.ab_table({}, ["head"]), (False, ["  no case matched the filter: FAILED"]))

    def test_check_summary_and_devices(self):
        log = ("commit: abc\npython: /usr/bin/python3\nLD_LIBRARY_PATH=/x\n  libnccl.so.2: ncclGetVersion() = 22703\n"
               "towerlab sees 1 CUDA device\n  cuda:0 (NVIDIA H100 80GB HBM3, sm_90) ok\n"
               "towerlab_devices: exit 0\nNVIDIA H100 80GB HBM3, 570.1, 81559 MiB\n")
        self.assertEqual(judge.check_summary(log), [
            "  python: /usr/bin/python3", "    libnccl.so.2: ncclGetVersion() = 22703", "  towerlab sees 1 CUDA device",
            "    cuda:0 (NVIDIA H100 80GB HBM3, sm_90) ok", "  towerlab_devices: exit 0",
            "  NVIDIA H100 80GB HBM3, 570.1, 81559 MiB"])
        self.assertEqual(judge.devices_verdict("  cuda:0 (H100) ok\n", 0), 0)
        self.assertEqual(judge.devices_verdict("  cuda:0 (H100) WRONG: 3 != 4\n", 1), 1)
        self.assertEqual(judge.devices_verdict("no CUDA device: cudaErrorNoDevice\n", 0), 3)
        self.assertEqual(judge.devices_verdict("no CUDA device: cudaErrorNoDevice\n", 2), 3)

    def test_profile(self):
        self.assertEqual(judge.profile_cases("matmul_bench BM_Cuda/cuda_NN/4096 5 2\n\nconv2d_bench fwd\n"),
                         [("matmul_bench", "BM_Cuda/cuda_NN/4096", "5", "2"), ("conv2d_bench", "fwd", "20", "1")])
        report = ("  sgemm_kernel (32, 32, 1)x(256, 1, 1), Context 1\n    Duration    us    2,945\n"
                  "    L1 Hit Rate   %   3\n")
        self.assertEqual(judge.profile_summary(report), ["    sgemm_kernel (32, 32, 1)x(256, 1, 1), Context 1",
                                                       "    Duration    us    2,945"])


class Packing(unittest.TestCase):
    LDD = ("\tlinux-vdso.so.1 (0x00007ffc)\n\tlibnccl.so.2 => /usr/local/cuda/lib64/libnccl.so.2 (0x1)\n"
           "\tlibgtest.so.1.14.0 => /lib/x86_64-linux-gnu/libgtest.so.1.14.0 (0x2)\n"
           "\tlibopenblas.so.0 => /lib/libopenblas.so.0 (0x3)\n\t/lib64/ld-linux-x86-64.so.2 (0x4)\n")

    def test_what_travels(self):
        libraries = judge.parse_ldd(self.LDD)
        self.assertEqual(libraries["libnccl.so.2"], "/usr/local/cuda/lib64/libnccl.so.2")
        self.assertIsNone(libraries["ld-linux-x86-64.so.2"])
        self.assertEqual(judge.libraries_to_carry(libraries, refuse=False),
                         {"libgtest.so.1.14.0": "/lib/x86_64-linux-gnu/libgtest.so.1.14.0",
                          "libopenblas.so.0": "/lib/libopenblas.so.0"})
        with self.assertRaisesRegex(judge.Failed, "libopenblas.so.0 is linked, but the gpu preset keeps it out"):
            judge.libraries_to_carry(libraries, refuse=True)
        with self.assertRaisesRegex(judge.Failed, "libyaml-cpp.so.0.8 is not found here"):
            judge.parse_ldd("\tlibyaml-cpp.so.0.8 => not found\n")

    def test_sizes_against_the_limit(self):
        self.assertEqual(judge.travel_line(10 * 2**20, 48 * 2**20, "build/gpu-carry"),
                         (True, "travels: working tree 10.0 MiB + build/gpu-carry 48.0 MiB = 58.0 MiB (limit 64 MiB)"))
        self.assertTrue(judge.travel_line(2**26 - 1, 1, "c")[0])
        self.assertFalse(judge.travel_line(2**26, 1, "c")[0])

    def test_a_long_log_is_cut_to_its_ends(self):
        self.assertEqual(judge.cut_log(b"short"), b"short")
        data = b"a" * (2 * 2**20) + b"b" * (2 * 2**20)
        cut = judge.cut_log(data)
        self.assertEqual(len(cut), 2 * 2**20 + len(b"\n[... cut by gpu.py ...]\n"))
        self.assertTrue(cut.startswith(b"a" * 2**20) and cut.endswith(b"b" * 2**20))

    def test_a_dataset_subset_is_valid_idx_and_fits(self):
        with tempfile.TemporaryDirectory() as src, tempfile.TemporaryDirectory() as dst:
            for split, count in (("train", 60000), ("t10k", 10000)):
                # Labels compress to nothing; images of noise compress little, as photographs do.
                with gzip.open(f"{src}/{split}-labels-idx1-ubyte.gz", "wb", 1) as f:
                    f.write(struct.pack(">II", 2049, count) + bytes(i % 10 for i in range(count)))
                with gzip.open(f"{src}/{split}-images-idx3-ubyte.gz", "wb", 1) as f:
                    f.write(struct.pack(">IIII", 2051, count, 28, 28) + os.urandom(count // 20 * 784)
                            + bytes(count * 784 - count // 20 * 784))
            line = judge.write_idx_subset(src, dst, 3 * 2**20)
            count = int(line.split()[3])
            self.assertTrue(1000 <= count < 60000 and count % 1000 == 0, line)
            sizes = sum(os.path.getsize(os.path.join(dst, f)) for f in os.listdir(dst))
            self.assertLessEqual(sizes, 3 * 2**20)
            with gzip.open(f"{dst}/train-images-idx3-ubyte.gz") as f:
                data = f.read()
            self.assertEqual(struct.unpack(">IIII", data[:16]), (2051, count, 28, 28))
            self.assertEqual(len(data), 16 + count * 784)
            with self.assertRaisesRegex(judge.Failed, "not even 1000 training images fit"):
                judge.write_idx_subset(src, dst, 1000)


class Commands(unittest.TestCase):
    def test_every_command_parses(self):
        p = gpu.parser()
        for argv in (["prepare"], ["check"], ["verify", "o"], ["measure", "o"], ["lease", "o"], ["triage", "o"],
                     ["tests", "o"], ["sanitize", "o"], ["sanitize", "o", "racecheck"], ["bench", "o"],
                     ["train", "o"], ["peers", "o"], ["profile", "o"], ["ab", "o", "conv2d", "3"],
                     ["experiment", "o", "sgemm_staging", "--size", "64"]):
            args = p.parse_args(argv)
            self.assertEqual(args.command, argv[0])
        self.assertEqual(p.parse_args(["experiment", "o", "x", "--size", "64"]).args, ["--size", "64"])
        self.assertEqual(p.parse_args(["ab", "o", "f"]).rounds, 2)

    def test_the_benches_most_important_first(self):
        names = gpu.bench_names()
        self.assertEqual(names[:3], ["matmul_bench", "conv2d_bench", "trainer_bench"])
        self.assertNotIn("io_bench", names)


if __name__ == "__main__":
    unittest.main()
