"""longhaul's codecs on torch tensors (CPU), the same chains and wire format as `longhaul bench codecs` and the
training links. Used by user code and longhaul.torch.

    codec = longhaul.codecs.Codec("ef+topk:ratio=0.01+int4")
    tx, rx = StreamState("grad"), StreamState("grad")     # one per stream end
    pkt = codec.encode(grad, tx)                         # Packet: its bytes via the buffer protocol
    g = longhaul.codecs.decode(pkt, state=rx)            # or decode(bytes_received, out=g, state=rx)
"""
from typing import NamedTuple, Optional, Sequence, Tuple

import torch

from . import _C

Packet = _C.Packet
StreamState = _C.StreamState

__all__ = ["Codec", "Packet", "PacketInfo", "StreamState", "as_tensor", "decode", "inspect", "raw_bytes",
           "wire_bytes"]

_NAMES = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16"}
_DTYPES = {name: dtype for dtype, name in _NAMES.items()}


class PacketInfo(NamedTuple):
    shape: Tuple[int, ...]
    dtype: str  # "f32", "bf16" or "f16": the dtype decode gives back
    raw_bytes: int  # numel * 4: what an uncompressed fp32 send would cost
    wire_bytes: int
    codec: str  # the outermost codec ("ef", "zstd", "int8", ...)


def _check_tensor(t, what: str) -> str:
    """The codec dtype name of t, after checking that the codecs can read or write it in place."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{what}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in _NAMES:
        raise ValueError(f"{what}: dtype {t.dtype} is not one the codecs take (float32, bfloat16, float16)")
    if t.device.type != "cpu":
        # CUDA tensors are unverified: the bindings hand the codecs a CPU pointer. Debian's torch is CPU-only.
        why = "this torch build has no CUDA" if not torch.cuda.is_available() else "CUDA tensors are not supported yet"
        raise ValueError(f"{what}: tensor is on {t.device}; longhaul.codecs takes CPU tensors ({why})")
    if not t.is_contiguous():
        raise ValueError(f"{what}: tensor of shape {tuple(t.shape)} with strides {t.stride()} is not contiguous "
                         "(pass t.contiguous())")
    return _NAMES[t.dtype]


def _buffer(packet):
    """An object with the buffer protocol holding the packet: a uint8 tensor (as_tensor's) is viewed through numpy."""
    if isinstance(packet, torch.Tensor):
        if packet.dtype != torch.uint8 or packet.dim() != 1 or packet.device.type != "cpu" or \
                not packet.is_contiguous():
            raise ValueError(f"packet tensor must be a contiguous 1-D uint8 CPU tensor, not {packet.dtype}"
                             f"{tuple(packet.shape)} on {packet.device}")
        return packet.numpy()
    return packet


class Codec:
    """A codec chain, e.g. "int8", "ef+topk:ratio=0.01+int4", "preset:balanced". A bad spec raises ValueError."""

    def __init__(self, spec: str):
        self._chain = _C.Codec(spec)

    @property
    def spec(self) -> str:
        """The canonical spec, every option written out."""
        return self._chain.spec

    def packet_bytes(self, shape: Sequence[int]) -> int:
        """The packet's exact size for this shape (an upper bound when the chain ends in zstd)."""
        return self._chain.packet_bytes(list(shape))

    def encode(self, tensor: torch.Tensor, state: Optional[StreamState] = None) -> Packet:
        """Encodes a contiguous CPU float32/bfloat16/float16 tensor. `state` carries ef residuals and warm starts
        from one call to the next (None: a fresh one each call)."""
        dtype = _check_tensor(tensor, "encode")
        return self._chain.encode(tensor.data_ptr(), list(tensor.shape), dtype, state)

    def decode(self, packet, out: Optional[torch.Tensor] = None, state: Optional[StreamState] = None) -> torch.Tensor:
        """Same as longhaul.codecs.decode (the packet names its own chain)."""
        return decode(packet, out=out, state=state)

    def __repr__(self) -> str:
        return f"Codec({self.spec!r})"


def inspect(packet, verify_hash: bool = True) -> PacketInfo:
    """Shape, dtype, raw and wire bytes and codec of a packet (a Packet, bytes, bytearray, memoryview, numpy array
    or as_tensor's uint8 tensor). Corrupt bytes raise ValueError naming the field."""
    shape, dtype, raw, wire, codec = _C.inspect(_buffer(packet), verify_hash)
    return PacketInfo(tuple(shape), dtype, raw, wire, codec)


def decode(packet, out: Optional[torch.Tensor] = None, state: Optional[StreamState] = None) -> torch.Tensor:
    """The tensor a packet holds: into `out` (its shape and dtype must be the packet's), or a new CPU tensor.
    Without a state, the packet is decoded as a stream of its own (no ef or delta memory)."""
    buf = _buffer(packet)
    shape, dtype, _, _, _ = _C.inspect(buf, False)  # the hash is checked once, by decode_into
    if out is None:
        out = torch.empty(shape, dtype=_DTYPES[dtype])
    else:
        name = _check_tensor(out, "decode: out")
        if list(out.shape) != list(shape) or name != dtype:
            raise ValueError(f"decode: out is {name}{list(out.shape)}, the packet holds {dtype}{list(shape)}")
    _C.decode_into(buf, out.data_ptr(), list(out.shape), dtype, state)
    return out


def as_tensor(packet: Packet) -> torch.Tensor:
    """The packet's bytes as a uint8 tensor sharing its memory (no copy); decode and inspect accept it back."""
    return torch.frombuffer(packet, dtype=torch.uint8)


def raw_bytes(x) -> int:
    """numel * 4 (an uncompressed fp32 send) of a tensor, or of the tensor a packet holds."""
    if isinstance(x, torch.Tensor) and x.dtype != torch.uint8:
        return x.numel() * 4
    return inspect(x, verify_hash=False).raw_bytes


def wire_bytes(packet) -> int:
    """The packet's size in bytes."""
    return memoryview(_buffer(packet)).nbytes
