#!/usr/bin/env python3
"""Preemption-safe training of the fashion_mnist sample, end to end (README: Resuming).

    resume_test.py CASE SAMPLE WORKDIR [--mpirun "mpirun args"] [--ranks N] [--master M]
                   [--precision P]

Every case trains a short run (2 epochs of 5 steps of 32 images, a checkpoint every
2 steps) uninterrupted once, then interrupts the same command and runs it again, and
compares the final checkpoint (variables, moving statistics, optimizer slots), the
summaries file and the metrics with the uninterrupted run's. Cases:
  kill      kill -9 at 5 points (after a step between checkpoints, inside a save
            through the sample's pause hook, after an epoch's last step, in the second
            epoch after a resume, after the last step before the final save): the
            rerun ends bit-identical. Under --mpirun the kills hit other ranks too.
  controls  a resume that forgets the data position, or the optimizer's step,
            must not end bit-identical (the comparison can fail); another batch or
            seed is refused naming the first difference.
  sigterm   SIGTERM (to mpirun under --mpirun) stops at a step boundary with exit 4
            and a checkpoint there (every rank names the same step); the rerun ends
            bit-identical. A second SIGTERM during a save ends the run at once, and
            so does the deadline after the first one (shortened to 2 s by the
            sample's test hook) when a save hangs: the previous checkpoint intact.
  corrupt   a truncated newest checkpoint, and one with a flipped bit in its data, is
            skipped with a warning naming it; all of them unreadable: exit 2 naming them.
  layout    checkpointed on cpu,cpu, resumed on cpu (and under --mpirun on N ranks of
            one cpu tower): equal to float rounding (rtol 1e-4, atol 1e-5); the control
            (a resume without the data position) exceeds that tolerance.
--master M passes the sample's --master M to every run (sharded: the master split
across the towers). --precision P passes the sample's --precision P to every run (fp16: the
loss scale is in the checkpoints). With --master sharded, layout also resumes the sharded run's
checkpoint with the master on the host: on the same towers bit-identical (the
placement changes no bit), and on one cpu tower to float rounding.
Exits 0 when the case passes, 1 with what differed.
"""
import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "mpi"))
import compare_checkpoints  # noqa: E402

STEPS = 10  # 2 epochs of 5
TRAIN = ["--epochs", "2", "--steps", "5", "--batch", "32", "--checkpoint-every", "2",
         "--test-samples", "100", "--progress-every", "1", "--seed", "5"]
FINAL = "step-%06d.safetensors" % STEPS
TIMEOUT = 300


class Runner:
    def __init__(self, sample, workdir, mpirun, ranks, master):
        self.sample, self.workdir = sample, workdir
        self.extra = []  # more training options for every run of a case
        self.mpirun = mpirun.split() if mpirun else []
        self.ranks = ranks
        self.master = master  # the sample's --master for every run ("": its default)

    def command(self, name, devices="cpu,cpu", ranks=None, master=None):
        d = os.path.join(self.workdir, name)
        master = master if master is not None else self.master
        args = [self.sample, "--devices", devices, *TRAIN, *self.extra, "--checkpoint-dir", d,
                "--summaries", d + ".csv", "--metrics", d + ".json"]
        args += ["--master", master] if master else []
        n = ranks if ranks is not None else self.ranks
        return (self.mpirun + ["-np", str(n)] + args) if self.mpirun and n else args

    def env(self, **hooks):
        env = dict(os.environ)
        env.update({k: str(v) for k, v in hooks.items()})
        return env

    def run(self, name, expect=0, devices="cpu,cpu", ranks=None, master=None, **hooks):
        p = subprocess.run(self.command(name, devices, ranks, master), env=self.env(**hooks),
                           capture_output=True, text=True, timeout=TIMEOUT)
        if expect == "killed":
            ok = p.returncode != 0
        else:
            ok = p.returncode == expect
        if not ok:
            raise Failure(f"{name}: exit {p.returncode}, expected {expect}\n{p.stdout}\n{p.stderr}")
        return p

    def start(self, name, **hooks):
        return subprocess.Popen(self.command(name), env=self.env(**hooks), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)

    def path(self, name, *parts):
        return os.path.join(self.workdir, name, *parts)

    def fresh(self, name):
        for p in (self.path(name), self.path(name) + ".csv", self.path(name) + ".json"):
            if os.path.isdir(p):
                shutil.rmtree(p)
            elif os.path.exists(p):
                os.remove(p)
        return name


class Failure(Exception):
    pass


def differences(a, b, exact=True, rtol=0.0, atol=0.0):
    """What differs between two final checkpoints: [] when nothing."""
    x, y = compare_checkpoints.read(a), compare_checkpoints.read(b)
    if sorted(x) != sorted(y):
        return [f"different tensors: {sorted(set(x) ^ set(y))}"]
    bad = []
    for name in sorted(x):
        (xs, xv), (ys, yv) = x[name], y[name]
        if xs != ys:
            bad.append(f"{name}: shape {xs} vs {ys}")
        elif exact and xv.tobytes() != yv.tobytes():
            bad.append(f"{name}: bits differ")
        elif not exact and any(abs(u - v) > atol + rtol * abs(v) for u, v in zip(xv, yv)):
            largest = max(abs(u - v) for u, v in zip(xv, yv))
            bad.append(f"{name}: largest difference {largest:g}")
    return bad


def same_run(r, name, reference):
    """The final checkpoint, the summaries and the metrics equal the reference's."""
    bad = differences(r.path(reference, FINAL), r.path(name, FINAL))
    with open(r.path(reference) + ".csv") as a, open(r.path(name) + ".csv") as b:
        if a.read() != b.read():
            bad.append("summaries differ")
    with open(r.path(reference) + ".json") as a, open(r.path(name) + ".json") as b:
        drop = re.compile(r'.*"images_per_second".*\n')
        if drop.sub("", a.read()) != drop.sub("", b.read()):
            bad.append("metrics differ")
    return bad


def expect_same(r, name, reference):
    bad = same_run(r, name, reference)
    if bad:
        raise Failure(f"{name}: not the uninterrupted run's result: " + "; ".join(bad))
    print(f"{name}: bit-identical to the uninterrupted run")


def resumed_from(p, step):
    m = re.search(r"resuming from (\S+) \(epoch (\d+), step (\d+) of 5\)", p.stdout)
    if not m or not m.group(1).endswith("step-%06d.safetensors" % step):
        raise Failure(f"expected a resume from step {step}:\n{p.stdout}\n{p.stderr}")


def wait_for(process, pattern, stream="stderr"):
    """Reads the process's stream until a line matches; returns the match."""
    deadline = time.time() + TIMEOUT
    source = getattr(process, stream)
    seen = ""
    while time.time() < deadline:
        line = source.readline()
        if not line:
            break
        seen += line
        m = re.search(pattern, line)
        if m:
            return m
    process.kill()
    raise Failure(f"never printed {pattern!r}:\n{seen}")


def killed_in_save(r, name, step):
    """Starts the run, kills -9 the process paused inside the save of `step`."""
    p = r.start(name, TOWERLAB_TEST_PAUSE_IN_SAVE=step)
    m = wait_for(p, r"pid (\d+) paused in the save of (\S+)")
    os.kill(int(m.group(1)), signal.SIGKILL)
    p.communicate(timeout=TIMEOUT)
    leftovers = [f for f in os.listdir(r.path(name)) if ".tmp-" in f]
    if not leftovers:
        raise Failure(f"{name}: the paused save left no temporary file: the hook is not inside it")


def case_kill(r):
    ref = r.fresh("reference")
    r.run(ref)
    # (hooks, the rank that dies under mpirun, the checkpoint the rerun resumes from)
    points = [({"TOWERLAB_TEST_KILL_AFTER_STEP": 3}, 0, 2),   # between two checkpoints
              ("save", 0, 2),                                  # inside the save of step 4
              ({"TOWERLAB_TEST_KILL_AFTER_STEP": 5}, 1, 4),   # an epoch's end, before its test
              ({"TOWERLAB_TEST_KILL_AFTER_STEP": 10}, 2, 8)]  # the last step, before its save
    for i, (hooks, rank, resume_step) in enumerate(points):
        name = r.fresh(f"kill{i}")
        rank = rank if r.mpirun else 0
        if hooks == "save":
            killed_in_save(r, name, 4)
        else:
            r.run(name, expect="killed", TOWERLAB_TEST_KILL_RANK=rank, **hooks)
        resumed_from(r.run(name), resume_step)
        expect_same(r, name, ref)
    # Two kills in one run, the second in the resumed epoch 2.
    name = r.fresh("kill_twice")
    r.run(name, expect="killed", TOWERLAB_TEST_KILL_AFTER_STEP=1)
    r.run(name, expect="killed", TOWERLAB_TEST_KILL_AFTER_STEP=7,
          TOWERLAB_TEST_KILL_RANK=r.ranks - 1 if r.mpirun else 0)
    resumed_from(r.run(name), 6)
    expect_same(r, name, ref)
    p = r.run(name)  # finished: says so, trains nothing
    if "the run has finished" not in p.stdout or "epoch 1:" in p.stdout:
        raise Failure(f"a finished run started again:\n{p.stdout}")


def case_controls(r):
    ref = r.fresh("reference")
    r.run(ref)
    for part in ("data_position", "optimizer_step"):
        name = r.fresh(f"without_{part}")
        r.run(name, expect="killed", TOWERLAB_TEST_KILL_AFTER_STEP=3)
        resumed_from(r.run(name, TOWERLAB_TEST_RESUME_WITHOUT=part), 2)
        bad = differences(r.path(ref, FINAL), r.path(name, FINAL))
        if not bad:
            raise Failure(f"control: a resume without the {part} ended bit-identical")
        print(f"control without the {part}: differs as it must ({len(bad)} tensors)")
    # Another global batch, or another seed, in the reference's directory: refused
    # with the first difference, the checkpoints left as they were.
    before = sorted(os.listdir(r.path(ref)))
    for flags, message in [(["--batch", "16"], "another run (run/batch 32 in the file, 16 in "
                            "this run)"),
                           (["--seed", "6"], "'seed 5' in the file, 'seed 6' in this run")]:
        r.extra = flags
        p = r.run(ref, expect=2)
        r.extra = []
        if message not in p.stderr or len(p.stderr.strip().splitlines()) != 1:
            raise Failure(f"{flags}: not refused with one line naming the difference:\n{p.stderr}")
    if sorted(os.listdir(r.path(ref))) != before:
        raise Failure("a refused resume changed the checkpoint directory")
    print("another batch or seed: refused naming the first difference")


def children(pid):
    """The processes whose parent is `pid` (mpirun's ranks)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry))
    return found


def preempt(r, ref, name, to_mpirun):
    """SIGTERM while rank 0 waits after step 3: every rank checkpoints step 3."""
    name = r.fresh(name)
    p = r.start(name, TOWERLAB_TEST_PAUSE_AFTER_STEP=3)
    wait_for(p, r"paused after step 3")
    start = time.time()
    for pid in children(p.pid) if r.mpirun and not to_mpirun else [p.pid]:
        os.kill(pid, signal.SIGTERM)
    out, err = p.communicate(timeout=TIMEOUT)
    seconds = time.time() - start
    steps = re.findall(r"preempted \(SIGTERM\) after step (\d+): checkpoint (\S+);", err)
    expected_code = 1 if to_mpirun else 4
    if p.returncode != expected_code or len(steps) != max(r.ranks, 1) or len(set(steps)) != 1:
        raise Failure(f"{name}: exit {p.returncode} (expected {expected_code}), one step for "
                      f"every rank expected: {steps}\n{out}\n{err}")
    if not os.path.exists(steps[0][1]) or int(steps[0][0]) != 3:
        raise Failure(f"{name}: no checkpoint {steps[0][1]} at step 3")
    if seconds > 30:
        raise Failure(f"{name}: the job took {seconds:.0f} s to end")
    print(f"{name}: every rank stopped after step 3, exit {p.returncode} in {seconds:.1f} s")
    resumed_from(r.run(name), 3)
    expect_same(r, name, ref)


def case_sigterm(r):
    ref = r.fresh("reference")
    r.run(ref)
    name = r.fresh("sigterm")
    # To every process of the job, as a scheduler does (Slurm, Kubernetes): the
    # ranks stop together and exit 4, and so does mpirun.
    preempt(r, ref, "sigterm", to_mpirun=False)
    if r.mpirun:
        # To mpirun alone: it relays SIGTERM to the ranks, which stop together, but
        # it ends the job on its own terms (exit 1); the rerun still resumes exactly.
        preempt(r, ref, "sigterm_mpirun", to_mpirun=True)
    # A second SIGTERM ends the run at once, here inside the save of step 4: the
    # previous checkpoint (step 2) stays, and the rerun finishes bit-identical.
    if not r.mpirun:
        name = r.fresh("sigterm_twice")
        p = r.start(name, TOWERLAB_TEST_PAUSE_IN_SAVE=4)
        wait_for(p, r"paused in the save of")
        os.kill(p.pid, signal.SIGTERM)
        time.sleep(0.2)
        os.kill(p.pid, signal.SIGTERM)
        p.communicate(timeout=TIMEOUT)
        if p.returncode != -signal.SIGTERM:
            raise Failure(f"a second SIGTERM: exit {p.returncode}, expected death by SIGTERM")
        resumed_from(r.run(name), 2)
        expect_same(r, name, ref)
        # One SIGTERM while the save of step 4 hangs: the deadline ends the run.
        name = r.fresh("sigterm_deadline")
        p = r.start(name, TOWERLAB_TEST_PAUSE_IN_SAVE=4, TOWERLAB_TEST_STOP_DEADLINE_S=2)
        wait_for(p, r"paused in the save of")
        sent = time.time()
        os.kill(p.pid, signal.SIGTERM)
        p.communicate(timeout=TIMEOUT)
        waited = time.time() - sent
        if p.returncode != -signal.SIGALRM or not 1.5 < waited < 30:
            raise Failure(f"the stop deadline: exit {p.returncode} after {waited:.1f} s, "
                          "expected death by SIGALRM after about 2 s")
        resumed_from(r.run(name), 2)
        expect_same(r, name, ref)


def case_corrupt(r):
    ref = r.fresh("reference")
    r.run(ref)
    # The newest (step 6) cut short, then with one flipped bit in its data: each
    # time skipped with a warning naming it, and the run resumes from step 4.
    for how in ("truncated", "flipped"):
        name = r.fresh(f"corrupt_{how}")
        r.run(name, expect="killed", TOWERLAB_TEST_KILL_AFTER_STEP=7)  # keeps steps 4 and 6
        newest = r.path(name, "step-000006.safetensors")
        size = os.path.getsize(newest)
        with open(newest, "r+b") as f:
            if how == "truncated":
                f.truncate(size // 2)
            else:
                f.seek(size - 100)  # a weight's bits: the header still reads
                byte = f.read(1)[0]
                f.seek(size - 100)
                f.write(bytes([byte ^ 0x10]))
        p = r.run(name)
        if f"warning: skipping the checkpoint {newest}" not in p.stderr:
            raise Failure(f"{how}: no warning naming {newest}:\n{p.stderr}")
        resumed_from(p, 4)
        expect_same(r, name, ref)
    for f in os.listdir(r.path(name)):
        with open(r.path(name, f), "wb") as out:
            out.write(b"not a checkpoint")
    p = r.run(name, expect=2)
    if "no usable checkpoint" not in p.stderr or FINAL not in p.stderr:
        raise Failure(f"all corrupt: the message does not name them:\n{p.stderr}")
    print("corrupt: newest skipped with a warning; all corrupt: exit 2 naming them")


def case_layout(r):
    # Synchronized batch norm: with local batch norm each tower normalizes its own
    # slice, so another split is another model (README: Resuming).
    r.extra = ["--batchnorm", "sync"]
    tolerance = dict(exact=False, rtol=1e-4, atol=1e-5)
    ref = r.fresh("reference")
    r.run(ref, ranks=0)
    names = []
    for devices, ranks in [("cpu", 0)] + ([("cpu", r.ranks)] if r.mpirun else []):
        name = r.fresh(f"layout_{devices}_{ranks}")
        r.run(name, expect="killed", ranks=0, TOWERLAB_TEST_KILL_AFTER_STEP=3)
        resumed_from(r.run(name, devices=devices, ranks=ranks), 2)
        bad = differences(r.path(ref, FINAL), r.path(name, FINAL), **tolerance)
        if bad:
            raise Failure(f"{name}: beyond float rounding: " + "; ".join(bad))
        print(f"{name}: equal to the uninterrupted run within rtol 1e-4, atol 1e-5")
        names.append(name)
    if r.master == "sharded":
        # The sharded run's checkpoint resumed with the master on the host: the same
        # towers take the same steps, bit for bit; one tower, to float rounding.
        for devices, exact in [("cpu,cpu", True), ("cpu", False)]:
            name = r.fresh(f"layout_host_master_{devices.replace(',', '_')}")
            r.run(name, expect="killed", ranks=0, TOWERLAB_TEST_KILL_AFTER_STEP=3)
            resumed_from(r.run(name, devices=devices, ranks=0, master="cpu"), 2)
            bad = differences(r.path(ref, FINAL), r.path(name, FINAL),
                              **(dict(exact=True) if exact else tolerance))
            if bad:
                raise Failure(f"{name}: " + "; ".join(bad))
            print(f"{name}: resumed with the master on the host on {devices}: " +
                  ("bit-identical" if exact else "within rtol 1e-4, atol 1e-5"))
    name = r.fresh("layout_control")
    r.run(name, expect="killed", ranks=0, TOWERLAB_TEST_KILL_AFTER_STEP=3)
    r.run(name, devices="cpu", ranks=0, TOWERLAB_TEST_RESUME_WITHOUT="data_position")
    if not differences(r.path(ref, FINAL), r.path(name, FINAL), **tolerance):
        raise Failure("control: a resume without the data position is within the tolerance")
    print("control: a resume without the data position exceeds the tolerance")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("case", choices=["kill", "controls", "sigterm", "corrupt", "layout"])
    parser.add_argument("sample")
    parser.add_argument("workdir")
    parser.add_argument("--mpirun", default="")
    parser.add_argument("--ranks", type=int, default=0)
    parser.add_argument("--master", default="")
    parser.add_argument("--precision", default="")
    args = parser.parse_args()
    workdir = os.path.join(args.workdir, args.case + ("_mpi" if args.mpirun else "") +
                           ("_" + args.master.replace(":", "") if args.master else "") +
                           ("_" + args.precision if args.precision else ""))
    os.makedirs(workdir, exist_ok=True)
    r = Runner(args.sample, workdir, args.mpirun, args.ranks, args.master)
    if args.precision:
        TRAIN.extend(["--precision", args.precision])
    try:
        globals()["case_" + args.case](r)
    except Failure as e:
        print(f"FAILED: {e}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
