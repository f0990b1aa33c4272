# Tests of longhaul.codecs (python/longhaul/codecs.py over python/src/codecs_py.cpp): round trips of every codec
# family with error bounds taken from the wire format, packet sizes, zero-copy buffers, bad specs, corrupt packets
# and stream state. Run by ctest (label python) with PYTHONPATH=<build>/python.
import random
import threading

import numpy as np
import pytest
import torch

from longhaul import _C
from longhaul import codecs as lc

HEADER = 48  # compress/wire.h: the fixed header, then 8 bytes per dimension


def pad8(n):
    return (n + 7) // 8 * 8


def randn(shape, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g).to(dtype)


def quant_bytes(shape, bits, block=64, scale_bytes=2):
    """Size of an int8/int4/int2 packet (compress/stage_quant.cpp quant_layout): header, shape, per-block scales
    padded to 8, codes padded to 8."""
    n = int(np.prod(shape)) if shape else 1
    blocks = (n + block - 1) // block
    return HEADER + 8 * len(shape) + pad8(blocks * scale_bytes) + pad8((n * bits + 7) // 8)


def block_absmax(x, block):
    """Each element's block absmax (blocks of `block` along the flattened tensor)."""
    f = x.reshape(-1).float()
    n = f.numel()
    padded = torch.zeros((n + block - 1) // block * block)
    padded[:n] = f.abs()
    return padded.view(-1, block).amax(1).repeat_interleave(block)[:n]


def roundtrip(spec, x, **kw):
    codec = lc.Codec(spec)
    pkt = codec.encode(x, **kw)
    return codec, pkt, lc.decode(pkt)


# --- round trips ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(), (0,), (1,), (7,), (3, 5, 7), (2, 0, 3)])
def test_none_is_bit_exact(shape):
    x = randn(shape)
    if x.numel() > 2:
        x.view(-1)[0] = float("nan")
        x.view(-1)[1] = float("-inf")
    codec, pkt, y = roundtrip("none", x)
    assert y.shape == x.shape and y.dtype == torch.float32
    assert torch.equal(y.view(torch.int32), x.view(torch.int32))
    assert len(pkt) == HEADER + 8 * len(shape) + pad8(4 * x.numel()) == codec.packet_bytes(shape)


@pytest.mark.parametrize("spec,half", [("fp16", torch.float16), ("bf16", torch.bfloat16)])
def test_half_codecs_round_to_nearest_even(spec, half):
    x = randn((33, 17), seed=1)
    codec, pkt, y = roundtrip(spec, x)
    assert torch.equal(y, x.to(half).float())
    assert len(pkt) == HEADER + 16 + pad8(2 * x.numel()) == codec.packet_bytes(x.shape)


# Largest error of a block-absmax quantizer relative to the block's absmax: codes span [lo, hi] with scale
# absmax/|lo| (rounded up to fp16), so nearest rounding is off by half a step, and the value of opposite sign to the
# block's extreme clamps at hi, one step off: int8 1/128, int4 1/8, int2 (codes -1..1, scale absmax) 1/2.
QUANT_BOUND = {8: 1 / 127, 4: 1 / 7, 2: 1 / 2 * 1.001}


@pytest.mark.parametrize("bits", [8, 4, 2])
@pytest.mark.parametrize("block,scale", [(64, "fp16"), (32, "fp32"), (4, "fp16")])
@pytest.mark.parametrize("shape", [(1000,), (3, 7, 5), (1,)])
def test_quantizers_error_and_size(bits, block, scale, shape):
    x = randn(shape, seed=bits + block)
    spec = f"int{bits}:block={block},scale={scale}"
    codec, pkt, y = roundtrip(spec, x)
    err = (y - x).abs().reshape(-1)
    bound = block_absmax(x, block) * QUANT_BOUND[bits]
    assert bool((err <= bound).all()), f"{spec}: worst error {float((err - bound).max())} above the bound"
    expect = quant_bytes(shape, bits, block, 4 if scale == "fp32" else 2)
    assert len(pkt) == pkt.wire_bytes == codec.packet_bytes(shape) == expect
    assert pkt.raw_bytes == 4 * x.numel()


@pytest.mark.parametrize("bits,ratio", [(8, 256 / 66), (4, 256 / 34), (2, 256 / 18)])
def test_quantizer_ratio_follows_the_format(bits, ratio):
    # Block 64 with fp16 scales: 64 fp32 values (256 bytes) travel as 64*bits/8 code bytes + 2 scale bytes.
    x = randn((64 * 4096,), seed=3)
    pkt = lc.Codec(f"int{bits}").encode(x)
    got = lc.raw_bytes(x) / lc.wire_bytes(pkt)
    assert abs(got - ratio) / ratio < 1e-3, (bits, got, ratio)
    if bits == 8:
        assert 3.85 < got < 3.9
    if bits == 4:
        assert 7.5 < got < 7.55


def test_topk_keeps_the_largest_exactly():
    x = randn((1000,), seed=4)
    codec, pkt, y = roundtrip("topk:ratio=0.1", x)
    k = 100
    top = x.abs().topk(k).indices
    assert torch.equal(y[top], x[top])
    rest = torch.ones(1000, dtype=torch.bool)
    rest[top] = False
    assert bool((y[rest] == 0).all())
    # own section: k 16-bit indices (n <= 65536); child: a `none` packet of the k values.
    inner = HEADER + 8 + pad8(4 * k)
    assert len(pkt) == HEADER + 8 + pad8(2 * k) + inner == codec.packet_bytes((1000,))


def test_lowrank_recovers_a_low_rank_matrix():
    g = torch.Generator().manual_seed(5)
    m = torch.randn(64, 2, generator=g) @ torch.randn(2, 48, generator=g)
    codec, pkt, y = roundtrip("lowrank:rank=2", m)
    assert float((y - m).norm() / m.norm()) < 1e-4
    # P (64x2) and Q (48x2) as fp32 `none` packets inside the lowrank packet.
    assert len(pkt) == HEADER + 16 + (HEADER + 16 + 4 * 64 * 2) + (HEADER + 16 + 4 * 48 * 2)
    full = randn((64, 48), seed=6)
    _, _, y = roundtrip("lowrank:rank=4", full)
    assert 0 < float((y - full).norm() / full.norm()) < 1


def test_ef_topk_int2_one_packet():
    x = randn((4096,), seed=7)
    codec, pkt, y = roundtrip("ef+topk:ratio=0.05+int2", x)
    k = round(0.05 * 4096)
    kept = y != 0
    assert 0 < int(kept.sum()) <= k
    top = set(x.abs().topk(k).indices.tolist())
    assert set(kept.nonzero().view(-1).tolist()) <= top
    # the kept values went through int2: within half the largest |x| of their block of 64 values (at most |x|max)
    assert bool(((y - x)[kept].abs() <= x.abs().max() / 2 * 1.001).all())
    assert len(pkt) == codec.packet_bytes(x.shape)


def test_zstd_is_lossless_and_within_its_bound():
    x = randn((5000,), seed=8)
    codec, pkt, y = roundtrip("zstd", x)
    assert torch.equal(y, x)
    assert len(pkt) <= codec.packet_bytes(x.shape)
    zeros = torch.zeros(1 << 16)
    pkt = codec.encode(zeros)
    assert len(pkt) < lc.raw_bytes(zeros) / 100
    assert torch.equal(lc.decode(pkt), zeros)
    assert lc.inspect(pkt).codec == "zstd"


def test_preset_balanced_is_int4_and_zstd():
    codec = lc.Codec("preset:balanced")
    assert codec.spec.startswith("int4:") and codec.spec.split("+")[-1].startswith("zstd:")
    x = randn((3000,), seed=9)
    pkt = codec.encode(x)
    y = lc.decode(pkt)
    assert bool(((y - x).abs() <= block_absmax(x, 64) * QUANT_BOUND[4]).all())
    assert len(pkt) <= codec.packet_bytes(x.shape)
    assert len(pkt) < quant_bytes((3000,), 4) * 1.05


SPECS = ["none", "fp16", "bf16", "int8", "int4", "int2", "topk", "randk", "lowrank", "subspace", "spikes+int4",
         "ef+topk+int2", "zstd", "int8+zstd", "preset:balanced"]


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("shape", [(), (0,), (0, 5), (1,), (3,), (65,), (5, 13), (1, 1, 1, 1, 1, 1, 1, 1)])
def test_every_codec_on_odd_shapes(spec, shape):
    """Odd shapes either round-trip (to the input's shape) or raise ValueError naming why; never crash."""
    x = randn(shape, seed=10)
    codec = lc.Codec(spec)
    try:
        pkt = codec.encode(x)
    except ValueError as e:
        assert str(e)
        return
    y = lc.decode(pkt)
    assert y.shape == x.shape and y.dtype == x.dtype
    assert bool(torch.isfinite(y).all())
    if "zstd" in codec.spec:
        assert len(pkt) <= codec.packet_bytes(shape)
    else:
        assert len(pkt) == codec.packet_bytes(shape)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_inputs_come_back_in_their_dtype(dtype):
    x = randn((777,), seed=11, dtype=dtype)
    _, _, y = roundtrip("none", x)
    assert y.dtype == dtype and torch.equal(y, x)
    _, pkt, y = roundtrip("int8", x)
    assert y.dtype == dtype and lc.inspect(pkt).dtype == {torch.bfloat16: "bf16", torch.float16: "f16"}[dtype]
    eps = 2 ** -8 if dtype == torch.bfloat16 else 2 ** -11  # the output's rounding
    bound = block_absmax(x, 64) * (1 / 127) + x.float().abs() * eps * 1.01
    assert bool(((y.float() - x.float()).abs() <= bound).all())


# --- the packet's buffer --------------------------------------------------------------------------------------

def test_packet_bytes_are_shared_not_copied():
    x = randn((256,), seed=12)
    pkt = lc.Codec("int8").encode(x)
    view = memoryview(pkt)
    assert view.obj is pkt and view.nbytes == len(pkt) and view.format == "B"
    a, b = lc.as_tensor(pkt), torch.frombuffer(pkt, dtype=torch.uint8)
    assert a.data_ptr() == b.data_ptr() == np.frombuffer(pkt, dtype=np.uint8).ctypes.data
    copy = bytes(pkt)
    assert copy == view.tobytes() and len(copy) == len(pkt)
    # a byte changed through the view is the packet's: the checksum now fails; the copy still decodes
    a[HEADER + 8 + 3] ^= 0xFF
    with pytest.raises(ValueError, match="hash"):
        lc.decode(pkt)
    assert torch.equal(lc.decode(copy), lc.decode(bytearray(copy)))


def test_inspect_takes_any_buffer():
    x = randn((4, 64), seed=13)
    pkt = lc.Codec("int4").encode(x)
    want = lc.PacketInfo((4, 64), "f32", 4 * 256, len(pkt), "int4")
    raw = bytes(pkt)
    for buf in [pkt, raw, bytearray(raw), memoryview(raw), np.frombuffer(raw, dtype=np.uint8), lc.as_tensor(pkt)]:
        assert lc.inspect(buf) == want
        if not isinstance(buf, torch.Tensor):
            assert _C.inspect(buf) == ([4, 64], "f32", 1024, len(pkt), "int4")
    assert lc.raw_bytes(pkt) == 1024 and lc.wire_bytes(raw) == len(pkt)
    assert pkt.shape == [4, 64] and pkt.dtype == "f32" and pkt.codec == "int4"
    assert torch.equal(lc.decode(lc.as_tensor(pkt)), lc.decode(pkt))
    with pytest.raises(TypeError):
        lc.inspect(12345)


# --- bad input ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("spec,named", [("int9", "int9"), ("topk:ratio=2", "ratio"), ("", "empty"),
                                        ("ef+ef", "ef"), ("int8:block=3", "block"), ("zstd+int8", "zstd"),
                                        ("preset:nope", "nope")])
def test_bad_specs_raise_value_error_naming_the_part(spec, named):
    with pytest.raises(ValueError) as e:
        lc.Codec(spec)
    assert named in str(e.value)


def corruptions(pkt, rng, count):
    """(what, bytes) pairs: truncations, flipped header and payload bytes, random bytes, empty."""
    raw = bytes(pkt)
    yield "empty", b""
    for n in sorted(set([1, 8, 47, 48, 55, len(raw) - 8, len(raw) - 1] + [rng.randrange(len(raw)) for _ in range(8)])):
        yield f"truncated to {n}", raw[:max(n, 0)]
    yield "padded", raw + b"\0" * 8
    for i in range(min(len(raw), 64)):
        b = bytearray(raw)
        b[i] ^= 1 << rng.randrange(8)
        yield f"header byte {i}", bytes(b)
    for _ in range(count):
        b = bytearray(raw)
        for _ in range(rng.randint(1, 4)):
            b[rng.randrange(len(b))] = rng.randrange(256)
        if b != bytearray(raw):
            yield "random bytes", bytes(b)
    for n in [0, 7, 48, 64, 200]:
        yield f"{n} random bytes", bytes(rng.randrange(256) for _ in range(n))
    b = bytearray(rng.randrange(256) for _ in range(len(raw)))
    b[:8] = raw[:8]  # right magic and version, nonsense after
    yield "nonsense after a good magic", bytes(b)


@pytest.mark.parametrize("spec", ["none", "int8", "ef+topk:ratio=0.1+int2", "lowrank:rank=2", "spikes+int4",
                                  "int8+zstd", "preset:balanced", "subspace:k=4"])
def test_corrupt_packets_raise_value_error(spec):
    rng = random.Random(spec)
    x = randn((6, 40), seed=14)
    pkt = lc.Codec(spec).encode(x, lc.StreamState("grad"))
    tried = 0
    for what, data in corruptions(pkt, rng, 300):
        for verify in (True, False):
            try:
                lc.inspect(data, verify_hash=verify)
            except ValueError:
                pass
        with pytest.raises(ValueError):
            lc.decode(data)
        with pytest.raises(ValueError):
            lc.decode(data, out=torch.empty(6, 40), state=lc.StreamState("grad"))
        tried += 1
    assert tried > 300


@pytest.mark.parametrize("spec", ["int8", "ef+topk:ratio=0.1+int2", "lowrank:rank=2", "spikes+int4", "randk+fp16",
                                  "subspace:k=4", "int4+zstd"])
def test_corrupt_packets_past_the_checksum(spec):
    """With the checksum off, every other check of the decoder meets the corruption: each packet decodes or raises
    ValueError, and never crashes."""
    rng = random.Random("deep" + spec)
    x = randn((6, 40), seed=20)
    raw = bytes(lc.Codec(spec).encode(x, lc.StreamState("grad")))
    out = torch.empty(6, 40)
    rejected = 0
    for what, data in corruptions(raw, rng, 300):
        try:
            _C.decode_into(data, out.data_ptr(), [6, 40], "f32", verify_hash=False)
        except ValueError:
            rejected += 1
    assert rejected > 50


def test_corrupt_messages_name_the_field():
    raw = bytearray(lc.Codec("int8").encode(randn((64,))))
    for pos, field in [(0, "magic"), (4, "version"), (6, "codec"), (7, "dtype"), (8, "ndim"), (9, "role"),
                       (20, "reserved"), (40, "hash")]:
        b = bytearray(raw)
        b[pos] = 0xEE
        with pytest.raises(ValueError, match=field):
            lc.decode(bytes(b))
    with pytest.raises(ValueError, match="truncated"):
        lc.inspect(raw[:20])


def test_decode_out_must_match():
    x = randn((8, 16), seed=15)
    pkt = lc.Codec("int8").encode(x)
    out = torch.full((8, 16), 7.0)
    got = lc.decode(pkt, out=out)
    assert got is out and torch.equal(out, lc.decode(pkt))
    for bad in [torch.empty(16, 8), torch.empty(128), torch.empty(8, 16, dtype=torch.float16),
                torch.empty(16, 8).t(), torch.empty(8, 16, dtype=torch.int32)]:
        with pytest.raises(ValueError):
            lc.decode(pkt, out=bad)
    # the C++ side checks too, for callers of _C
    with pytest.raises(ValueError, match="shape"):
        _C.decode_into(pkt, out.data_ptr(), [16, 8], "f32")
    with pytest.raises(ValueError, match="dtype"):
        _C.decode_into(pkt, out.data_ptr(), [8, 16], "f64")


def test_bad_tensors_are_refused():
    codec = lc.Codec("int8")
    with pytest.raises(ValueError, match="contiguous"):
        codec.encode(randn((8, 16)).t())
    with pytest.raises(ValueError, match="contiguous"):
        codec.encode(randn((64,))[::2])
    with pytest.raises(ValueError, match="dtype"):
        codec.encode(torch.arange(10))
    with pytest.raises(ValueError, match="dtype"):
        codec.encode(torch.zeros(4, dtype=torch.float64))
    with pytest.raises(ValueError, match="meta"):
        codec.encode(torch.empty(4, device="meta"))
    with pytest.raises(TypeError):
        codec.encode([1.0, 2.0])
    with pytest.raises(ValueError, match="dims"):
        codec.encode(torch.zeros([1] * 9))
    # and at the C++ boundary
    c = _C.Codec("int8")
    with pytest.raises(ValueError, match="negative"):
        c.encode(0, [-1], "f32")
    with pytest.raises(ValueError, match="null"):
        c.encode(0, [4], "f32")
    with pytest.raises(ValueError, match="f64"):
        c.encode(0, [0], "f64")
    with pytest.raises(ValueError):
        c.packet_bytes([-3])
    with pytest.raises(TypeError):
        c.encode(0, [0], "f32", state="grad")


def test_sliced_contiguous_input_is_read_at_its_offset():
    x = randn((10, 64), seed=16)
    _, _, y = roundtrip("none", x[3:5])
    assert torch.equal(y, x[3:5])


# --- stream state ---------------------------------------------------------------------------------------------

def running_sum_error(spec, x, steps):
    codec, tx = lc.Codec(spec), lc.StreamState("grad")
    total = torch.zeros_like(x, dtype=torch.float64)
    errs = []
    for t in range(1, steps + 1):
        total += lc.decode(codec.encode(x, tx), state=lc.StreamState("grad")).double()
        errs.append(float((total - t * x.double()).abs().max()))
    assert tx.packets_encoded == steps
    return errs


def test_error_feedback_carries_over_between_calls():
    x = randn((1024,), seed=17)
    bound = float(x.abs().max())
    ef = running_sum_error("ef+int4", x, 200)
    plain = running_sum_error("int4", x, 200)
    # ef: the running sum stays within one quantization step of the truth (the residual is bounded) ...
    assert max(ef) <= bound / 7 * 1.01
    # ... while plain int4 makes the same error every step: it grows linearly.
    assert plain[0] > 0
    assert abs(plain[199] / plain[0] - 200) < 0.5
    assert plain[199] > 100 * ef[199]
    # the sparse chain too: what topk leaves out is sent later, while without ef it is never sent
    sparse = running_sum_error("ef+topk:ratio=0.1+int2", x, 100)
    lost = running_sum_error("topk:ratio=0.1+int2", x, 100)
    assert max(sparse[50:]) < 5 * bound
    assert lost[99] > 10 * max(sparse[50:])


def test_state_reset_and_bytes():
    x = randn((512,), seed=18)
    codec = lc.Codec("ef+topk:ratio=0.05+int4")
    st = lc.StreamState("grad", seed=3)
    assert (st.role, st.seed, st.packets_encoded) == ("grad", 3, 0)
    first = bytes(codec.encode(x, st))
    second = bytes(codec.encode(x, st))
    assert first != second  # the residual changed what was sent
    saved = st.to_bytes()
    restored = lc.StreamState.from_bytes(saved)
    assert (restored.role, restored.seed, restored.packets_encoded) == ("grad", 3, 2)
    assert bytes(codec.encode(x, st)) == bytes(codec.encode(x, restored))
    st.reset()
    assert st.packets_encoded == 0
    assert bytes(codec.encode(x, st)) == first
    with pytest.raises(ValueError):
        lc.StreamState.from_bytes(saved[: len(saved) // 2])


def test_state_roles():
    with pytest.raises(ValueError, match="bogus"):
        lc.StreamState("bogus")
    with pytest.raises(ValueError, match="other"):
        lc.StreamState("other")
    for role in ["act", "act_grad", "grad", "tp"]:
        assert lc.StreamState(role).role == role
    pkt = lc.Codec("int8").encode(randn((64,)), lc.StreamState("tp"))
    lc.decode(pkt)  # no state: the packet's own role
    lc.decode(pkt, state=lc.StreamState("tp"))
    with pytest.raises(ValueError, match="role"):
        lc.decode(pkt, state=lc.StreamState("grad"))


def test_threads_share_codecs_and_states():
    codec = lc.Codec("ef+int8")
    states = [lc.StreamState("grad") for _ in range(2)]
    x = randn((1 << 16,), seed=19)
    want = lc.decode(codec.encode(x))
    errors = []

    def work(i):
        try:
            for _ in range(20):
                y = lc.decode(codec.encode(x, states[i % 2]))
                if not torch.isfinite(y).all() or float((y - x).abs().max()) > 2 * float((want - x).abs().max()) + 1:
                    errors.append("bad decode")
        except Exception as e:  # noqa: BLE001
            errors.append(repr(e))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert sum(s.packets_encoded for s in states) == 80
