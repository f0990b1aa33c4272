"""Runs a case of rank_cases.py in N real processes, as torchrun would start them (env:// rendezvous: MASTER_ADDR,
MASTER_PORT, RANK, WORLD_SIZE), and collects what each rank returns."""
import json
import os
import socket
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
KEY = "7f" * 32  # the tests' job secret (64 hex digits)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RankFailure(Exception):
    def __init__(self, results):
        super().__init__("\n".join(f"rank {r}: rc={x['rc']}\n{x['stderr'][-3000:]}" for r, x in results.items()))
        self.results = results


def run(case, world, args=None, env=None, rank_env=None, timeout=240, expect_ok=True, script="rank_cases.py"):
    """Starts `world` processes of `script` (a case file beside this one) running `case`; returns {rank: {"rc", "out"
    (the case's return value, or None), "stderr"}}. env: for every rank; rank_env: {rank: {...}} on top. Raises
    RankFailure when a rank fails and expect_ok."""
    port = free_port()
    procs = {}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(world):
            e = dict(os.environ)
            e.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(r), "WORLD_SIZE": str(world),
                      "LOCAL_RANK": str(r), "LH_JOB_KEY": KEY, "OMP_NUM_THREADS": "1", "UCX_NET_DEVICES": "lo",
                      "CASE_OUT": os.path.join(tmp, f"out{r}.json"), "CASE_ARGS": json.dumps(args or {})})
            e.update(env or {})
            e.update((rank_env or {}).get(r, {}))
            e = {k: v for k, v in e.items() if v is not None}
            procs[r] = subprocess.Popen([sys.executable, os.path.join(HERE, script), case], env=e,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        results = {}
        for r, p in procs.items():
            try:
                _, err = p.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                for q in procs.values():
                    q.kill()
                _, err = p.communicate()
                err += f"\n(killed after {timeout} s)"
            out_path = os.path.join(tmp, f"out{r}.json")
            out = None
            if os.path.exists(out_path):
                with open(out_path) as f:
                    out = json.load(f)
            results[r] = {"rc": p.returncode, "out": out, "stderr": err}
    if expect_ok and any(x["rc"] != 0 for x in results.values()):
        raise RankFailure(results)
    return results


def serve(namespace):
    """A case file's main: runs the `case_NAME` function of `namespace` (the file's globals()) that argv names and
    writes its return value as JSON to $CASE_OUT."""
    cases = {k[5:]: v for k, v in namespace.items() if k.startswith("case_")}
    result = cases[sys.argv[1]]()
    with open(os.environ["CASE_OUT"], "w") as f:
        json.dump(result, f)
    sys.stdout.flush()
    os._exit(0)  # a case may leave a group whose peer is gone (peer_dies): do not wait on teardown
