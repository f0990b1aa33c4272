"""The "longhaul" backend of torch.distributed (docs/torch.md).

    import longhaul.torch                         # registers the backend
    dist.init_process_group("longhaul")           # torchrun's env://, or any c10d store
    longhaul.torch.set_codec(None, "ef+int4")     # compress the default group's float32 all-reduces
    model = DistributedDataParallel(model)        # unchanged

Every rank needs the same job secret: LH_JOB_KEY_FILE (a file made by `longhaul keygen FILE`) or LH_JOB_KEY (its 64
hex digits). It authenticates what each rank puts in the store and every packet between ranks.
"""
import json
import os
from datetime import timedelta

import torch.distributed as dist

from . import _C

__all__ = ["set_codec", "codec", "set_p2p_codec", "p2p_codec", "all_reduce", "PowerSGDState", "powersgd_hook",
           "link_stats", "counters", "log_step", "LonghaulProcessGroup", "DiLoCo"]

LonghaulProcessGroup = _C.LonghaulProcessGroup


def _seconds(timeout):
    if isinstance(timeout, timedelta):
        return timeout.total_seconds()
    return float(timeout)


def _create(opts, pg_options=None):
    return _C._create_process_group(opts.store, opts.group_rank, opts.group_size, _seconds(opts.timeout),
                                    str(opts.group_id), list(opts.global_ranks_in_group))


if "LONGHAUL" not in dist.Backend._plugins:
    dist.Backend.register_backend("longhaul", _create, extended_api=True)


def _group(group):
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    if not isinstance(pg, LonghaulProcessGroup):
        raise ValueError(f"longhaul: {group!r} is not a group of the longhaul backend")
    return pg


def set_codec(group, spec):
    """Compresses `group`'s float32 SUM/AVG all-reduces with the codec chain `spec` (longhaul's grammar: "int8",
    "ef+int4", "ef+topk:ratio=0.01+int2", "none", ...) from the next one on; None is the default group. Every rank
    ends with the same bits. Raises ValueError naming what is wrong with a bad spec."""
    _C._set_codec(_group(group), spec)


def codec(group=None):
    """The codec chain of `group`'s float32 all-reduces."""
    return _group(group).codec


def set_p2p_codec(group, spec):
    """Encodes `group`'s point-to-point sends (send/isend/P2POp) with `spec` from the next one on, and decodes its
    receives: compressed activations and gradients between the stages of a user's own pipeline. Both ends must set
    the same; float32, float16 and bfloat16 tensors only while it is not "none". One codec stream per (peer, tag)
    and way, so "ef+..." keeps its residuals per link."""
    _C._set_p2p_codec(_group(group), spec)


def p2p_codec(group=None):
    """The codec of `group`'s point-to-point transfers."""
    return _group(group).p2p_codec


class PowerSGDState:
    """The state of powersgd_hook: the group, the rank of the factors (1..1024), and the codec of P, Q and the
    uncompressed rest on the wire ("none", "bf16", "fp16", ...)."""

    def __init__(self, group=None, rank=4, wire="none"):
        self.group = group
        self.rank = int(rank)
        self.wire = wire


def powersgd_hook(state, bucket):
    """A DDP comm hook (model.register_comm_hook(PowerSGDState(...), powersgd_hook)) running longhaul's PowerSGD, the
    C++ jobs' two-round reducer: per weight matrix (gradient plus error feedback) P = M·Q is averaged, orthonormalized,
    Q = Mᵀ·P̂ averaged, and M̂ = P̂·Q̂ᵀ replaces the gradient; Q warm-starts the next step; vectors are averaged as
    they are. Every rank ends with the same bits."""
    pg = _group(state.group)
    shapes = [list(p.shape) for p in bucket.parameters()]
    work = pg._powersgd(bucket.buffer(), bucket.index(), shapes, state.rank, state.wire)
    return work.get_future().then(lambda fut: fut.value()[0])


def all_reduce(tensor, codec="none", op="avg", group=None, stream=None, async_op=False):
    """All-reduces a float32 tensor in place through `codec` (whatever the group's own codec is): "avg" or "sum".
    `stream` (an id ≥ 0) names the error-feedback state the codec keeps across calls (e.g. one per parameter bucket);
    None keys it by the tensor's memory. Every rank ends with the same bits. Returns the Work when async_op."""
    work = _group(group)._allreduce_coded(tensor, op, codec, -1 if stream is None else int(stream))
    if async_op:
        return work
    work.wait()
    return None


def link_stats():
    """This rank's per-link counters since the last log_step: {"rank", "links": [{"src", "dst", "role", "dir",
    "messages", "raw_bytes", "wire_bytes", "seconds", ...}], "bandwidth": [...]}."""
    return json.loads(_C._link_stats())


def counters():
    """The data plane's totals: rank, world, auth_failures (packets refused), dropped_packets, transports."""
    return dict(_C._plane_counters())


def log_step(step, loss=None, path=None, group=None):
    """Writes this rank's metrics line for `step` (the JSON-lines format `longhaul report` reads: per link and role,
    raw and wire bytes, messages, busy seconds, and the group's codec on gradient links) to `path` (default
    $LH_METRICS; nothing is written when neither is set), restarts the counters, and returns the line as a dict.
    Ranks may share one file: each line is appended with a single write."""
    line = _C._metrics_line(int(step), None if loss is None else float(loss), codec(group))
    path = path or os.environ.get("LH_METRICS")
    if path:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)
    return json.loads(line)


from .diloco import DiLoCo  # noqa: E402
