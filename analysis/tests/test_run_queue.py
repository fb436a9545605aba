"""experiments/paper/run_queue.sh: one-run shards dealt to the GPUs as they free up, each through
run_why_mx.sh on one GPU, everything back in one OUTDIR; done items are skipped by the same
command on the same machine, and nothing starts too close to the deadline. Through the real script
with the CPU binary behind a wrapper and a stand-in nvidia-smi naming two GPUs."""
import os
import subprocess

from conftest import ROOT, run_device_script

TINY = """name: queue_tiny
seed: 1
steps: 40
device: cpu
model: {depth: 1, width: 32, hidden_mult: 2}
data: {batch: 16}
optimizer: {lr: 1.0e-3}
precision: {weight: mxfp8_e4m3, activation: mxfp8_e4m3, grad: mxfp8_e4m3}
log: {log_every: 10}
sweep:
  seeds: [1, 2, 3]
"""
ITEMS = ["queue_tiny=0/3", "queue_tiny=1/3", "queue_tiny=2/3"]
TAGS = ["queue_tiny_0of3", "queue_tiny_1of3", "queue_tiny_2of3"]


def test_every_item_comes_back_and_a_second_call_skips_them(binary, tmp_path):
    out, log = run_device_script(binary, tmp_path, {"queue_tiny": TINY}, ITEMS, script="run_queue.sh", gpus=2)
    assert "run_queue: 3 of 3 items done" in log, log
    files = sorted(os.listdir(out))
    # run_why_mx.sh's files of each item (no branch points: these runs have no branches), its logs
    # renamed per item, nothing else (no item folder left behind)
    assert files == sorted([f"{k}_{t}.csv" for t in TAGS for k in ("summary", "blocks")] +
                           [f"logs_{t}.tgz" for t in TAGS]), files
    for t in TAGS:
        assert (tmp_path / "runs" / "queue" / t).exists()
        with open(os.path.join(out, f"summary_{t}.csv")) as f:
            assert len(f.read().strip().splitlines()) == 3  # header, fp32, mx: one run per item
    # both GPUs took items
    assert "GPU 0:" in log and "GPU 1:" in log, log
    before = {p: os.path.getmtime(os.path.join(out, p)) for p in files}
    out2, log2 = run_device_script(binary, tmp_path, {}, ITEMS, script="run_queue.sh", gpus=2)
    assert "run_queue: 3 of 3 items done" in log2 and "GPU" not in log2, log2
    assert {p: os.path.getmtime(os.path.join(out2, p)) for p in os.listdir(out2)} == before


def test_nothing_starts_too_close_to_the_deadline(binary, tmp_path):
    out, log = run_device_script(binary, tmp_path, {"queue_tiny": TINY}, ITEMS[:1], script="run_queue.sh",
                                 env_extra={"MXLAB_QUEUE_MIN_LEFT": "1000"})
    assert "run_queue: 0 of 1 items done" in log and "GPU" not in log, log
    assert not (tmp_path / "runs" / "queue" / TAGS[0]).exists()


def test_a_min_left_below_what_run_why_mx_needs_is_raised(binary, tmp_path):
    # with 130 s left run_why_mx.sh would skip the shard (it keeps 75 s and trains only with more than
    # 60 beyond): the queue does not claim it, so no "not finished" line for an item that never ran
    _, log = run_device_script(binary, tmp_path, {"queue_tiny": TINY}, ITEMS[:1], script="run_queue.sh",
                               deadline="130", env_extra={"MXLAB_QUEUE_MIN_LEFT": "10"})
    assert "MXLAB_QUEUE_MIN_LEFT=10 raised to 136" in log, log
    assert "run_queue: 0 of 1 items done" in log and "GPU" not in log, log


def test_bad_items_are_refused_in_one_line(tmp_path):
    script = os.path.join(ROOT, "experiments", "paper", "run_queue.sh")
    for items, says in ((["why_mx_e2"], "is not EXP=SHARD/N"), (["no_such_exp=0/1"], "no experiments/paper/no_such_exp.yaml"),
                        ([], "no items")):
        r = subprocess.run(["bash", script, str(tmp_path / "out"), "100", *items], cwd=ROOT, capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 2 and says in r.stderr and len(r.stderr.strip().splitlines()) == 1, (items, r.stderr)


def test_mxlab_bin_trains_with_another_binary_than_devbins(binary, tmp_path):
    # .devbin holds a branch under test (here one that cannot train); MXLAB_BIN names the binary the
    # study's runs use (main's, carried as .devref), through the queue to run_why_mx.sh
    (tmp_path / ".devbin").mkdir()
    broken = tmp_path / ".devbin" / "mxlab"
    broken.write_text("#!/bin/sh\necho 'the branch binary ran' >&2\nexit 3\n")
    broken.chmod(0o755)
    # without it the item does not train (so the check below can fail)
    _, log = run_device_script(binary, tmp_path, {"queue_tiny": TINY}, ITEMS[:1], script="run_queue.sh")
    assert "run_queue: 0 of 1 items done" in log, log
    out, log2 = run_device_script(binary, tmp_path, {}, ITEMS[:1], script="run_queue.sh",
                                  env_extra={"MXLAB_BIN": "build/mxlab"})
    assert "run_queue: 1 of 1 items done" in log2, log2
    assert f"summary_{TAGS[0]}.csv" in os.listdir(out)


def test_a_missing_mxlab_bin_is_refused_in_one_line(tmp_path):
    script = os.path.join(ROOT, "experiments", "paper", "run_why_mx.sh")
    r = subprocess.run(["bash", script, str(tmp_path / "out"), "100", "why_mx_e2=0/40"], cwd=tmp_path,
                       env=dict(os.environ, MXLAB_BIN=str(tmp_path / "nothing"), MXLAB_GPUS="0"),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "MXLAB_BIN=" in r.stderr and "not an executable" in r.stderr, r.stdout + r.stderr


def test_a_failed_extraction_leaves_the_item_undone_and_the_next_call_completes_it(binary, tmp_path):
    # an extractor that fails (here: python3 refuses extract_spectral.py) must not leave a shard that
    # looks complete: the loss blocks (the done marker) come last, no half-written file stays behind,
    # and the next call extracts the finished run again
    real = subprocess.run(["bash", "-c", "command -v python3"], capture_output=True, text=True).stdout.strip()
    (tmp_path / "shim").mkdir()
    shim = tmp_path / "shim" / "python3"
    shim.write_text(f'#!/bin/sh\ncase "$*" in *extract_spectral.py*) echo "spectral refused" >&2; exit 1 ;; esac\n'
                    f'exec {real} "$@"\n')
    shim.chmod(0o755)
    out, log = run_device_script(binary, tmp_path, {"queue_tiny": TINY}, ITEMS[:1], script="run_queue.sh",
                                 env_extra={"PATH": f"{tmp_path / 'shim'}:{tmp_path / 'bin'}:{os.environ['PATH']}"})
    assert "run_queue: 0 of 1 items done" in log, log
    files = os.listdir(out)
    assert f"blocks_{TAGS[0]}.csv" not in files and not [f for f in files if ".tmp_" in f], files
    # the item's log (its last lines, which run_queue.sh prints for an unfinished item) names the
    # extractor that failed, timed
    assert "extract spectral: exit 1 after" in log, log
    # and the queue says the training ended and an extractor failed, not that the run resumes
    assert "not finished: its training ended, but an extractor failed (spectral: exit 1 after" in log, log
    assert "resumes from its checkpoints" not in log, log
    out2, log2 = run_device_script(binary, tmp_path, {}, ITEMS[:1], script="run_queue.sh")
    assert "run_queue: 1 of 1 items done" in log2, log2
    assert f"blocks_{TAGS[0]}.csv" in os.listdir(out2)


def test_a_gpu_named_twice_takes_two_items_at_once(binary, tmp_path):
    out, log = run_device_script(binary, tmp_path, {"queue_tiny": TINY}, ITEMS, script="run_queue.sh", gpus=1,
                                 env_extra={"MXLAB_GPUS": "0,0"})
    assert "run_queue: 3 of 3 items done" in log, log
    started = [line for line in log.splitlines() if line.endswith(tuple(ITEMS)) and "GPU 0:" in line]
    assert len(started) == 3 and "GPU 1" not in log, log
    # two workers: the first two items start before either has finished
    first_done = next(i for i, line in enumerate(log.splitlines()) if line.endswith(" done"))
    assert sum(1 for line in log.splitlines()[:first_done] if line.endswith(tuple(ITEMS))) == 2, log
    assert sorted(f for f in os.listdir(out) if f.startswith("blocks_")) == sorted(f"blocks_{t}.csv" for t in TAGS)


def test_an_experiment_whose_items_took_longer_than_the_time_left_is_passed_over(binary, tmp_path):
    # what a done item took is kept per experiment on the machine (runs/queue/EXP.seconds); an item of
    # an experiment that took longer than the time left (+ the 75 s run_why_mx.sh keeps) does not
    # start, and a later item of another experiment (no history: the MIN_LEFT rule alone) still does
    slow = TINY.replace("name: queue_tiny", "name: queue_slow")
    out, log = run_device_script(binary, tmp_path, {"queue_tiny": TINY, "queue_slow": slow}, ITEMS[:1],
                                 script="run_queue.sh")
    assert "run_queue: 1 of 1 items done" in log, log
    took = int((tmp_path / "runs" / "queue" / "queue_tiny.seconds").read_text())
    assert 0 < took < 200 and f"an item of queue_tiny took up to {took} s here" in log, log
    (tmp_path / "runs" / "queue" / "queue_slow.seconds").write_text("1000\n")
    out2, log2 = run_device_script(binary, tmp_path, {}, ["queue_slow=0/3", ITEMS[1]], script="run_queue.sh")
    assert "run_queue: 1 of 2 items done" in log2 and "queue_slow=0/3" not in log2.split("run_queue:")[0], log2
    assert (tmp_path / "runs" / "queue" / TAGS[1]).exists()
    assert not (tmp_path / "runs" / "queue" / "queue_slow_0of3").exists()
    # with MXLAB_QUEUE_RESUME (the next call resumes it), it starts all the same
    _, log_r = run_device_script(binary, tmp_path, {}, ["queue_slow=0/3"], script="run_queue.sh",
                                 env_extra={"MXLAB_QUEUE_RESUME": "1"})
    assert "GPU 0: queue_slow=0/3" in log_r and "run_queue: 1 of 1 items done" in log_r, log_r
    (tmp_path / "runs" / "queue" / "queue_slow_0of3").unlink()
    # with the deadline beyond its length + 75 s, it starts
    _, log3 = run_device_script(binary, tmp_path, {}, ["queue_slow=0/3"], script="run_queue.sh", deadline="1200",
                                env_extra={"MXLAB_QUEUE_MIN_LEFT": "0"})
    assert "run_queue: 1 of 1 items done" in log3, log3


def test_a_length_measured_on_earlier_machines_stands_in_until_this_machine_learns_one(binary, tmp_path):
    # experiments/paper/queue_seconds.txt (EXP SECONDS, # comments): on a machine with no item of
    # EXP done yet, an item starts only with that + 75 s left; once one is done, what it took here
    # replaces it
    slow = TINY.replace("name: queue_tiny", "name: queue_slow")
    # (a first call that starts nothing sets the scratch tree up)
    _, log0 = run_device_script(binary, tmp_path, {"queue_tiny": TINY, "queue_slow": slow}, ITEMS[:1],
                                script="run_queue.sh", env_extra={"MXLAB_QUEUE_MIN_LEFT": "1000"})
    assert "run_queue: 0 of 1 items done" in log0, log0
    (tmp_path / "experiments" / "paper" / "queue_seconds.txt").write_text(
        "# measured elsewhere\nqueue_slow 1000  # too long for this call\nqueue_tiny 5\n")
    _, log = run_device_script(binary, tmp_path, {}, ["queue_slow=0/3", ITEMS[0]], script="run_queue.sh")
    assert "run_queue: 1 of 2 items done" in log and "GPU 0: queue_slow=0/3" not in log, log
    assert "GPU 0: queue_tiny=0/3 done" in log, log
    # the prior is not reported as learnt here; what the done item took is
    assert "queue_slow took" not in log and "an item of queue_tiny took up to" in log, log
    assert not (tmp_path / "runs" / "queue" / "queue_slow.seconds").exists()
    # with the deadline beyond it + 75 s, it starts
    _, log2 = run_device_script(binary, tmp_path, {}, ["queue_slow=0/3"], script="run_queue.sh", deadline="1200",
                                env_extra={"MXLAB_QUEUE_MIN_LEFT": "0"})
    assert "run_queue: 1 of 1 items done" in log2, log2


def test_the_committed_lengths_name_experiments_of_the_queue():
    path = os.path.join(ROOT, "experiments", "paper", "queue_seconds.txt")
    lines = [l.split("#")[0].split() for l in open(path)]
    entries = [l for l in lines if l]
    assert entries, path
    for e in entries:
        assert len(e) == 2 and e[1].isdigit() and 0 < int(e[1]) < 600, e
        assert os.path.exists(os.path.join(ROOT, "experiments", "paper", e[0] + ".yaml")), e


def _fake_gpu_tests(root, rc):
    """A stand-in .devbin/mxlab_gpu_tests (only it: run_why_mx.sh keeps training with build/mxlab)."""
    (root / ".devbin").mkdir(parents=True, exist_ok=True)
    t = root / ".devbin" / "mxlab_gpu_tests"
    t.write_text(f"#!/bin/sh\necho run >> {root / 'gpu_test_runs'}\necho \"gpu $CUDA_VISIBLE_DEVICES\"\n"
                 f"echo '[  PASSED  ] 2 tests.'\nexit {rc}\n")
    t.chmod(0o755)


def test_queue_call_packs_every_item_and_runs_the_gpu_tests_once_per_machine(binary, tmp_path):
    """experiments/paper/queue_call.sh: the GPU tests on GPU 0 beside the queue, once per machine; the
    items' files as one q.tgz that results/ingest_queue.py files; --last switches the resume off."""
    import tarfile
    _fake_gpu_tests(tmp_path, 0)
    out, log = run_device_script(binary, tmp_path, {"queue_tiny": TINY}, ["--gputests", *ITEMS],
                                 script="queue_call.sh", gpus=2)
    assert "run_queue: 3 of 3 items done" in log and "MXLAB_QUEUE_RESUME=1" in log, log
    assert "[  PASSED  ] 2 tests." in log and "exit 0 after" in log, log
    assert sorted(os.listdir(out)) == ["gpu_tests.log", "q.tgz", "queue.log"]
    assert open(os.path.join(out, "gpu_tests.log")).read().startswith("gpu 0\n")
    with tarfile.open(os.path.join(out, "q.tgz")) as t:
        names = {n for n in t.getnames() if n.startswith("q/") and n.count("/") == 1}
    assert names == {f"q/{k}_{t}.csv" for t in TAGS for k in ("summary", "blocks")} | {f"q/logs_{t}.tgz" for t in TAGS}
    r = subprocess.run(["python3", os.path.join(ROOT, "results", "ingest_queue.py"), os.path.join(out, "q.tgz"),
                        "--dest", f"queue_tiny={tmp_path / 'filed'}", "--dry-run"], capture_output=True, text=True)
    assert r.returncode == 0 and "queue_tiny: 3 finished item(s)" in r.stdout, r.stdout + r.stderr
    # a second call on the same machine: the tests are not run again, the items are done, --last
    out2, log2 = run_device_script(binary, tmp_path, {}, ["--gputests", "--last", *ITEMS], script="queue_call.sh",
                                   gpus=2)
    assert "gpu tests: ran on this machine already" in log2 and "last call" in log2, log2
    assert "run_queue: 3 of 3 items done" in log2 and "] GPU" not in log2, log2
    assert (tmp_path / "gpu_test_runs").read_text() == "run\n"


def test_queue_call_runs_failed_gpu_tests_again_and_refuses_bad_arguments(binary, tmp_path):
    _fake_gpu_tests(tmp_path, 1)
    out, log = run_device_script(binary, tmp_path, {"queue_tiny": TINY}, ["--gputests", ITEMS[0]],
                                 script="queue_call.sh")
    assert "exit 1 after" in log and not (tmp_path / "runs" / "queue" / "gputests.done").exists(), log
    _, log2 = run_device_script(binary, tmp_path, {}, ["--gputests", ITEMS[0]], script="queue_call.sh")
    assert "ran on this machine already" not in log2 and "exit 1 after" in log2, log2
    assert (tmp_path / "gpu_test_runs").read_text() == "run\nrun\n"
    for args, msg in ((["--fast", ITEMS[0]], "unknown option --fast"), (["--last"], "no items")):
        r = subprocess.run(["bash", os.path.join(ROOT, "experiments", "paper", "queue_call.sh"), str(tmp_path / "o"),
                            "100", *args], cwd=tmp_path, capture_output=True, text=True)
        assert r.returncode == 2 and msg in r.stderr, r.stderr


def test_a_length_measured_on_a_shared_gpu_is_kept_apart_from_one_alone(binary, tmp_path):
    # an item that shared its GPU (MXLAB_GPUS=0,0) took about twice as long: its length is kept as
    # EXP.shared2.seconds, so a later call that gives each item a GPU of its own is not held back by
    # it; a call that shares GPUs without a shared measurement expects N x the length alone
    _, log = run_device_script(binary, tmp_path, {"queue_tiny": TINY}, ITEMS[:2], script="run_queue.sh",
                               env_extra={"MXLAB_GPUS": "0,0"})
    assert "run_queue: 2 of 2 items done" in log, log
    q = tmp_path / "runs" / "queue"
    took = int((q / "queue_tiny.shared2.seconds").read_text())
    assert 0 < took < 200 and not (q / "queue_tiny.seconds").exists(), log
    assert f"an item of queue_tiny took up to {took} s here on a GPU shared by 2 items" in log, log
    # a shared length far beyond the deadline does not hold back an item alone on its GPU
    (q / "queue_tiny.shared2.seconds").write_text("5000\n")
    _, log2 = run_device_script(binary, tmp_path, {}, [ITEMS[2]], script="run_queue.sh", deadline="400",
                                env_extra={"MXLAB_QUEUE_MIN_LEFT": "0"})
    assert "run_queue: 1 of 1 items done" in log2, log2
    # alone it took 500 s (say): two to a GPU need 2 x 500 + 75 s, one alone 575 s
    (q / "queue_tiny.shared2.seconds").unlink()
    (q / "queue_tiny.seconds").write_text("500\n")
    for t in TAGS:
        (q / t).unlink()
    _, log3 = run_device_script(binary, tmp_path, {}, ITEMS[:1], script="run_queue.sh", deadline="900",
                                env_extra={"MXLAB_GPUS": "0,0", "MXLAB_QUEUE_MIN_LEFT": "0"})
    assert "run_queue: 0 of 1 items done" in log3 and "GPU 0:" not in log3, log3
    _, log4 = run_device_script(binary, tmp_path, {}, ITEMS[:1], script="run_queue.sh", deadline="900",
                                env_extra={"MXLAB_GPUS": "0", "MXLAB_QUEUE_MIN_LEFT": "0"})
    assert "run_queue: 1 of 1 items done" in log4, log4
