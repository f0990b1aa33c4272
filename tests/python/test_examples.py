"""The examples run as the README says (python3 -m longhaul.torchrun ...), and `longhaul report` reads what they
write."""
import os
import re
import subprocess
import sys

import pytest

import ranks

ROOT = os.path.abspath(os.path.join(ranks.HERE, "..", ".."))


def torchrun(script, *args, env=None):
    e = dict(os.environ, LH_JOB_KEY=ranks.KEY, OMP_NUM_THREADS="1", UCX_NET_DEVICES="lo", **(env or {}))
    cmd = [sys.executable, "-m", "longhaul.torchrun", "--nproc_per_node", "2", "--master_port", str(ranks.free_port()),
           os.path.join(ROOT, "examples", script), *args]
    p = subprocess.run(cmd, env=e, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout


def test_the_pipeline_example_equals_one_process_with_none():
    out = torchrun("torch_pipeline.py", "--codec", "none", "--check", "--steps", "30")
    diff = float(re.search(r"largest relative difference from one process: (\S+)", out).group(1))
    assert diff <= 1e-6, out


def test_the_pipeline_example_compresses_both_ways_and_trains():
    out = torchrun("torch_pipeline.py", "--codec", "int8", "--steps", "30")
    m = re.search(r"loss (\S+) -> (\S+); .*\((\S+)x less\)", out)
    first, last, ratio = float(m.group(1)), float(m.group(2)), float(m.group(3))
    assert last < first and 3.5 < ratio < 4.1, out


def test_the_ddp_example_on_gloo_codecs_and_powersgd_and_report_reads_its_metrics(tmp_path):
    assert "gloo: 2 processes, 20 steps" in torchrun("torch_ddp.py", "--backend", "gloo", "--steps", "20")
    metrics = tmp_path / "m.jsonl"
    out = torchrun("torch_ddp.py", "--codec", "ef+int4", "--steps", "20", "--metrics", str(metrics))
    ratio = float(re.search(r"\((\S+)x less\)", out).group(1))
    assert 7.0 < ratio < 8.1, out
    out = torchrun("torch_ddp.py", "--powersgd", "4", "--steps", "20")
    assert float(re.search(r"\((\S+)x less\)", out).group(1)) > 10, out
    lh_bin = os.environ.get("LH_BIN")
    if not lh_bin or not os.path.exists(lh_bin):
        pytest.skip("no longhaul binary (LH_BIN) to run report with")
    rep = subprocess.run([lh_bin, "report", str(metrics)], capture_output=True, text=True, timeout=60)
    assert rep.returncode == 0, rep.stderr
    rows = [l for l in rep.stdout.splitlines() if " grad " in l]
    assert len(rows) == 2 and all("ef+int4" in r for r in rows), rep.stdout
    assert "steps 0..19, 40 records from 2 workers" in rep.stdout, rep.stdout
