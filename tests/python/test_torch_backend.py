"""The "longhaul" backend of torch.distributed, in real processes (ranks.py starts them as torchrun would)."""
import math

import pytest

import ranks


@pytest.mark.parametrize("world", [2, 4])
def test_every_collective_is_exact_against_gloo_and_a_float64_reference(world):
    res = ranks.run("collectives", world)
    for r, x in res.items():
        assert x["out"]["checks"] > 250, x["out"]
        assert x["out"]["failures"] == [], f"rank {r}: {x['out']['failures']}"


def _ddp(world, **args):
    return ranks.run("ddp", world, args=args)


def test_ddp_with_none_gives_glooss_losses_bit_for_bit_at_two_processes():
    lh, gl = _ddp(2, backend="longhaul", codec="none"), _ddp(2, backend="gloo")
    for r in range(2):
        assert lh[r]["out"]["losses"] == gl[r]["out"]["losses"], f"rank {r}"
        assert lh[r]["out"]["hashes"] == gl[r]["out"]["hashes"], f"rank {r}"
    # every rank holds the same parameters after every step
    assert lh[0]["out"]["hashes"] == lh[1]["out"]["hashes"]
    # nothing compressed: what crossed is what the gradients weigh
    assert lh[0]["out"]["wire"] > 0
    assert 0.95 < lh[0]["out"]["raw"] / lh[0]["out"]["wire"] < 1.05
    assert lh[0]["out"]["counters"]["auth_failures"] == 0


def test_ddp_with_none_matches_gloo_to_1e_5_at_four_processes():
    lh, gl = _ddp(4, backend="longhaul", codec="none", steps=12), _ddp(4, backend="gloo", steps=12)
    for r in range(4):
        for a, b in zip(lh[r]["out"]["losses"], gl[r]["out"]["losses"]):
            assert math.isclose(a, b, rel_tol=1e-5), (r, a, b)
    assert len({x["out"]["hashes"][-1] for x in lh.values()}) == 1


@pytest.mark.parametrize("codec,ratio_lo,ratio_hi", [("int8", 3.5, 4.1), ("ef+int4", 6.0, 8.1)])
def test_ddp_trains_with_a_compressed_codec_and_meters_its_ratio(codec, ratio_lo, ratio_hi):
    steps = 30
    lh, gl = _ddp(2, backend="longhaul", codec=codec, steps=steps), _ddp(2, backend="gloo", steps=steps)
    for r in range(2):
        out = lh[r]["out"]
        assert out["codec"] == codec
        # bit-equal replicas after every step
        assert out["hashes"] == lh[1 - r]["out"]["hashes"]
        # it trains: the last 5 steps' loss fell well below the first 5 steps' and stays near gloo's
        first, last = sum(out["losses"][:5]) / 5, sum(out["losses"][-5:]) / 5
        ref_last = sum(gl[r]["out"]["losses"][-5:]) / 5
        assert last < 0.9 * first, out["losses"]
        assert abs(last - ref_last) < 0.1 * ref_last, (last, ref_last)
        # the meter sees the codec's ratio (raw fp32 bytes over wire bytes, packet headers included)
        ratio = out["raw"] / out["wire"]
        assert ratio_lo < ratio < ratio_hi, ratio


def test_a_bad_codec_is_a_value_error_naming_it():
    res = ranks.run("bad_codec", 2)
    errs = res[0]["out"]
    assert "int9" in errs["int9"]
    assert "ratio" in errs["topk:ratio=2"]
    assert errs[""] is not None
    assert "ef" in errs["ef+ef"]


def test_a_missing_secret_is_named():
    res = ranks.run("init", 2, env={"LH_JOB_KEY": None, "LH_JOB_KEY_FILE": None}, args={"timeout": 10},
                    expect_ok=False)
    for x in res.values():
        assert x["out"] is not None and "no job secret" in x["out"]["error"], x


def test_a_rank_with_another_secret_is_refused_naming_it():
    res = ranks.run("init", 2, rank_env={1: {"LH_JOB_KEY": "3c" * 32}}, args={"timeout": 10}, expect_ok=False)
    # rank 1 cannot verify rank 0's epoch; rank 0 cannot verify rank 1's entry
    assert "does not verify" in res[0]["out"]["error"] and "rank 1" in res[0]["out"]["error"], res[0]
    assert "does not verify" in res[1]["out"]["error"], res[1]


def test_a_world_size_mismatch_is_named():
    res = ranks.run("init", 2, rank_env={1: {"WORLD_SIZE": "3"}}, args={"timeout": 10}, expect_ok=False)
    assert "world of 2" in res[1]["out"]["error"] and "3" in res[1]["out"]["error"], res[1]


def test_a_peer_that_dies_fails_the_others_op_naming_it_within_the_timeout():
    res = ranks.run("peer_dies", 3, args={"timeout": 20}, expect_ok=False)
    for r in (0, 1):
        out = res[r]["out"]
        assert out is not None and out["error"] is not None, res[r]
        assert "rank 2" in out["error"], out["error"]
        assert out["seconds"] < 25, out


@pytest.mark.parametrize("codec", ["int8", "ef+int4"])
def test_point_to_point_carries_a_codec_with_a_state_per_link(codec):
    res = ranks.run("p2p_codec", 2, args={"codec": codec})
    assert res[1]["out"]["ok"] == [True] * 5  # the bits longhaul.codecs gives, state carried across sends
    out = res[0]["out"]
    assert out["raw"] / out["wire"] > 3.5, out
    assert "int64" in out["error"] and "p2p codec" in out["error"], out["error"]


def test_powersgd_reconstructs_a_low_rank_average_and_trains_ddp_as_a_comm_hook():
    res = ranks.run("powersgd", 2)
    for r in range(2):
        out = res[r]["out"]
        for m_err, b_err in out["errs"]:
            assert m_err < 1e-4 and b_err < 1e-5, out["errs"]
        assert out["hashes"] == res[1 - r]["out"]["hashes"]
        assert sum(out["losses"][-5:]) < sum(out["losses"][:5]), out["losses"]
        assert out["raw"] / out["wire"] > 2, out


def test_lh_link_shapes_every_link_like_launch_link():
    res = ranks.run("shaped", 2, env={"LH_LINK": "8M,20ms"})
    # 1 MB at 8 Mbit/s takes at least one second (being slower is allowed: the machine is shared)
    assert res[1]["out"]["seconds"] >= 0.95, res[1]["out"]
    bw = [b for b in res[0]["out"]["bandwidth"] if b["dir"] == "send"]
    assert bw and all(b["bps"] <= 8.5e6 for b in bw), bw


def test_a_bad_lh_link_is_named():
    res = ranks.run("init", 2, env={"LH_LINK": "fast"}, args={"timeout": 10}, expect_ok=False)
    assert "LH_LINK" in res[0]["out"]["error"], res[0]


def test_a_forged_packet_is_counted_and_dropped_and_the_genuine_one_arrives():
    res = ranks.run("forged", 2)
    assert res[1]["out"]["equal"], res[1]
    assert res[1]["out"]["auth_failures"] >= 1, res[1]
    assert res[0]["out"]["auth_failures"] == 0, res[0]
