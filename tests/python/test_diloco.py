"""longhaul.torch.DiLoCo: at world 1 (no process group) against the inner optimizer alone and a hand-written outer
step, bad input, resuming from state_dict, and in 2 real processes (diloco_cases.py starts them as torchrun would)."""
import io
import os
import re
import subprocess
import sys

import pytest
import torch

import diloco_cases
import longhaul.torch as lht
import ranks


def mlp(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))


def batch(step):
    g = torch.Generator().manual_seed(step)
    return torch.randn(16, 8, generator=g), torch.randint(0, 3, (16,), generator=g)


def train_step(model, opt, step):
    x, y = batch(step)
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()


def equal_params(a, b):
    return all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


INNER = {"sgd": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9),
         "adamw": lambda ps: torch.optim.AdamW(ps, lr=1e-3, weight_decay=0.1)}


@pytest.mark.parametrize("inner", sorted(INNER))
def test_H1_lr1_no_momentum_is_the_inner_optimizer_bit_for_bit(inner):
    # θ_sync − (θ_sync − θ) is θ exactly when θ_sync − θ is exact, which Sterbenz's lemma gives for θ within a factor
    # 2 of θ_sync with the same sign: hence weights in [1, 2], which one small step keeps there. (A weight that
    # crosses zero within a round may come back one rounding off, in the C++ jobs as here.)
    models = [mlp(), mlp()]
    for m in models:
        with torch.no_grad():
            for p in m.parameters():
                p.uniform_(1, 2, generator=torch.Generator().manual_seed(p.numel()))
    assert equal_params(*models)
    alone = INNER[inner](models[0].parameters())
    dl = lht.DiLoCo(models[1], INNER[inner](models[1].parameters()), sync="diloco:H=1,outer_lr=1,outer_momentum=0")
    for step in range(30):
        train_step(models[0], alone, step)
        train_step(models[1], dl, step)
        assert equal_params(*models), f"step {step}"
    assert dl.rounds == 30 and dl.steps == 30
    assert dl.bytes_received == 0  # a world of one sends nothing


def test_the_outer_step_is_nesterov_in_float32_against_a_hand_written_reference():
    H, lr, mu = 3, 0.7, 0.9
    a, b = mlp(), mlp()
    spec = f"diloco:H={H},outer_lr={lr},outer_momentum={mu}"
    dl = lht.DiLoCo(a, torch.optim.AdamW(a.parameters(), lr=1e-2), sync=spec)
    ref_inner = torch.optim.AdamW(b.parameters(), lr=1e-2)
    flat = lambda m: torch.cat([p.detach().reshape(-1) for p in m.parameters()])  # noqa: E731
    sync, mom = flat(b).clone(), torch.zeros_like(flat(b))
    lr32, mu32 = torch.tensor(lr, dtype=torch.float32), torch.tensor(mu, dtype=torch.float32)
    for step in range(5 * H):
        train_step(a, dl, step)
        train_step(b, ref_inner, step)
        if (step + 1) % H == 0:
            # in float32, one rounding per operation, in the C++ order
            d = sync - flat(b)
            mom = mu32 * mom + d
            sync = sync - lr32 * (d + mu32 * mom)
            with torch.no_grad():
                off = 0
                for p in b.parameters():
                    p.copy_(sync[off:off + p.numel()].view_as(p))
                    off += p.numel()
        assert equal_params(a, b), f"step {step}"
    assert dl.rounds == 5
    # the momentum mattered: without it the weights differ
    c = mlp()
    dl0 = lht.DiLoCo(c, torch.optim.AdamW(c.parameters(), lr=1e-2), sync=f"diloco:H={H},outer_lr={lr},outer_momentum=0")
    for step in range(5 * H):
        train_step(c, dl0, step)
    assert not equal_params(a, c)


@pytest.mark.parametrize("sync,named", [("every-step", "every-step"), ("delayed:D=2", "delayed:D=2"),
                                        ("diloco:H=0", "H must be"), ("diloco:outer_lr=-1", "outer_lr"),
                                        ("diloco:H=5,lr=1", "'lr'"), ("sometimes", "sometimes")])
def test_a_bad_sync_is_a_value_error_naming_it(sync, named):
    m = mlp()
    with pytest.raises(ValueError, match=named):
        lht.DiLoCo(m, torch.optim.SGD(m.parameters(), lr=0.1), sync=sync)


@pytest.mark.parametrize("codec,named", [("int9", "int9"), ("ef+ef", "ef"), ("delta", "delta"),
                                         ("powersgd:rank=2", "PowerSGD")])
def test_a_bad_codec_is_a_value_error_naming_it(codec, named):
    m = mlp()
    with pytest.raises(ValueError, match=named):
        lht.DiLoCo(m, torch.optim.SGD(m.parameters(), lr=0.1), sync="diloco:H=2", codec=codec)


@pytest.mark.parametrize("stream", [-1, 1 << 19])
def test_a_stream_out_of_range_is_refused(stream):
    m = mlp()
    with pytest.raises(ValueError, match=str(stream)):
        lht.DiLoCo(m, torch.optim.SGD(m.parameters(), lr=0.1), stream=stream)


def test_non_float32_parameters_are_refused():
    m = mlp().double()
    with pytest.raises(ValueError, match="float64"):
        lht.DiLoCo(m, torch.optim.SGD(m.parameters(), lr=0.1))


def test_a_run_resumed_from_state_dict_takes_the_same_steps():
    H, steps, stop = 3, 13, 7  # stopped after round 2 and one more inner step: θ ≠ θ_sync and the count matters
    sync = f"diloco:H={H},outer_lr=0.7,outer_momentum=0.9"

    def make():
        m = mlp()
        return m, lht.DiLoCo(m, torch.optim.AdamW(m.parameters(), lr=1e-2), sync=sync)

    whole, dl = make()
    for step in range(steps):
        train_step(whole, dl, step)

    first, dl1 = make()
    for step in range(stop):
        train_step(first, dl1, step)
    f = io.BytesIO()
    torch.save({"model": first.state_dict(), "inner": dl1.inner.state_dict(), "diloco": dl1.state_dict()}, f)
    for step in range(stop, steps):  # the first run goes on, so the saved tensors must be copies
        train_step(first, dl1, step)
    f.seek(0)
    saved = torch.load(f)
    resumed, dl2 = make()
    resumed.load_state_dict(saved["model"])
    dl2.inner.load_state_dict(saved["inner"])
    dl2.load_state_dict(saved["diloco"])
    assert dl2.steps == stop and dl2.rounds == stop // H
    for step in range(stop, steps):
        train_step(resumed, dl2, step)
    assert equal_params(resumed, whole)
    assert dl2.rounds == steps // H

    # a state from another sync spec or another model is refused
    other, dl3 = make()
    with pytest.raises(ValueError, match="momentum|theta_sync"):
        small = torch.nn.Linear(2, 2)
        lht.DiLoCo(small, torch.optim.SGD(small.parameters(), lr=0.1), sync=sync).load_state_dict(saved["diloco"])
    with pytest.raises(ValueError, match="H=4"):
        lht.DiLoCo(other, torch.optim.SGD(other.parameters(), lr=0.1), sync="diloco:H=4").load_state_dict(
            saved["diloco"])


def test_a_longhaul_group_of_one_averages_nothing():
    out = diloco_cases.run("train", 1, args={"codec": "ef+int4", "H": 4, "rounds": 3})[0]["out"]
    assert len(set(out["hashes"])) == 3
    assert out["bytes_received"] == 0 and out["sent"]["wire"] == 0  # the codec has nothing to compress
    assert max(out["ref_err"]) < 1e-6, out["ref_err"]


@pytest.fixture(scope="module")
def two_ranks():
    return {codec: diloco_cases.run("train", 2, args={"codec": codec, "H": 5, "rounds": 8})
            for codec in ("none", "ef+int4")}


@pytest.mark.parametrize("codec", ["none", "ef+int4"])
def test_two_ranks_hold_bit_equal_weights_after_every_round_and_the_loss_falls(two_ranks, codec):
    res = two_ranks[codec]
    r0, r1 = res[0]["out"], res[1]["out"]
    assert len(r0["hashes"]) == 8
    assert r0["hashes"] == r1["hashes"]
    assert len(set(r0["hashes"])) == 8  # every round moved the weights
    for out in (r0, r1):
        assert out["losses"][-1] < 0.7 * out["losses"][0], out["losses"]
    assert r0["losses"] != r1["losses"]  # each rank trained on its own samples
    if codec == "none":
        # the outer step of the average of both ranks' pseudo-gradients (a float64 reference from the ranks' θ)
        assert max(r0["ref_err"]) < 1e-6, r0["ref_err"]


def test_ef_int4_sends_at_least_6x_fewer_pseudo_gradient_bytes_than_none(two_ranks):
    none, int4 = two_ranks["none"], two_ranks["ef+int4"]
    for r in range(2):
        n, c = none[r]["out"], int4[r]["out"]
        # the same float32 pseudo-gradients: at world 2, each round's all-reduce sends the peer one vector's worth
        assert n["sent"]["raw"] == c["sent"]["raw"] == 8 * 4 * n["params"]
        assert n["sent"]["wire"] >= 6 * c["sent"]["wire"], (n["sent"], c["sent"])
        # what one rank sent the other received, and DiLoCo counts what it received
        for out, peer in ((n, none[1 - r]["out"]), (c, int4[1 - r]["out"])):
            assert out["sent"] == peer["received"]
            assert out["bytes_received"] == out["received"]["wire"]
            assert out["raw_bytes_received"] == out["received"]["raw"]
        # and ef+int4 trains about as well as none
        assert c["losses"][-1] < 1.1 * n["losses"][-1]


def test_the_example_trains_under_torchrun_and_sends_far_less_than_every_step_ddp():
    root = os.path.abspath(os.path.join(ranks.HERE, "..", ".."))
    e = dict(os.environ, LH_JOB_KEY=ranks.KEY, OMP_NUM_THREADS="1", UCX_NET_DEVICES="lo")
    cmd = [sys.executable, "-m", "longhaul.torchrun", "--nproc_per_node", "2", "--master_port", str(ranks.free_port()),
           os.path.join(root, "examples", "torch_diloco.py"), "--codec", "ef+int4", "--H", "20", "--rounds", "10"]
    p = subprocess.run(cmd, env=e, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    losses = [float(x) for x in re.findall(r"rank 0's loss (\S+)", p.stdout)]
    assert len(losses) == 10 and losses[-1] < 0.8 * losses[0], p.stdout
    # ef+int4 is about 1/7.5 of float32, and one all-reduce per 20 steps: about 150x less than every-step DDP
    assert float(re.search(r": (\S+)x more", p.stdout).group(1)) > 100, p.stdout
