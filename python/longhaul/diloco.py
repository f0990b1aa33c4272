"""DiLoCo for any PyTorch model: H local steps of its own optimizer on each replica, then one all-reduce of the
pseudo-gradient and an outer Nesterov step, the C++ jobs' `--sync diloco`. longhaul.torch exports it;
examples/torch_diloco.py runs it.

    import longhaul.torch
    dist.init_process_group("longhaul")
    opt = longhaul.torch.DiLoCo(model, torch.optim.AdamW(model.parameters()), sync="diloco:H=50", codec="ef+int4")
    for x, y in data:
        opt.zero_grad(); loss_fn(model(x), y).backward(); opt.step()

The outer step is the jobs' own code (comm/dp_reducer.h diloco_outer_update, bound as _C.diloco_outer_update): with
Δ = θ_sync − θ averaged over the replicas, m := μ·m + Δ; θ_sync := θ_sync − lr·(Δ + μ·m); θ := θ_sync, all in float32.
The inner optimizer's state (e.g. AdamW's moments) carries on across rounds untouched, as in the jobs.
"""
import torch
import torch.distributed as dist

from . import _C
from . import torch as _lht

__all__ = ["DiLoCo"]

# Codec streams (longhaul.torch.all_reduce's `stream`, below _MAX_STREAM: bridge.h's kMaxUserStream) of DiLoCo objects
# that name none: one each, counted from _FIRST_STREAM in creation order (the same on every rank when every rank makes
# its objects in the same order), clear of the small ids callers pick for their own all-reduces.
_MAX_STREAM = 1 << 19
_FIRST_STREAM = _MAX_STREAM - (1 << 16)
_created = 0


def _next_stream():
    global _created
    s = _FIRST_STREAM + _created
    _created += 1
    return s


def _parse(sync):
    cfg = _C.parse_sync(sync)  # ValueError naming the bad part
    if cfg["kind"] != "diloco":
        raise ValueError(f"longhaul.torch.DiLoCo: sync '{sync}' is not diloco (expected "
                         "diloco:H=N,outer_lr=X,outer_momentum=M)")
    return cfg


class DiLoCo:
    """Wraps `inner_optimizer` (over `model`'s parameters, all float32 on the CPU): step() runs it and, every H-th
    step, averages the pseudo-gradient θ_sync − θ over `group` (the default group when None; no process group at all
    is a world of one) through longhaul.torch.all_reduce with `codec` and a codec stream of its own, takes the outer
    step and puts θ_sync back into the parameters, bit-identical on every replica. The replicas must start from the
    same parameters (broadcast them first). Only parameters are averaged: buffers (e.g. BatchNorm's running stats)
    stay each replica's own. `stream` (0 ≤ id < 2^19, the same on every rank) names the codec's error-feedback state;
    by default each DiLoCo object takes the next id from 2^19 − 2^16 on, in the order this process makes them."""

    def __init__(self, model, inner_optimizer, sync="diloco:H=50,outer_lr=0.7,outer_momentum=0.9", codec="none",
                 group=None, stream=None):
        self._cfg = _parse(sync)
        _C.check_grad_codec(codec, sync)  # the jobs' rule: a codec chain, none that needs per-sample state
        self.sync, self.codec = self._cfg["canonical"], codec
        self.H = self._cfg["H"]
        self.model, self.inner = model, inner_optimizer
        self._params = list(model.parameters())
        for i, p in enumerate(self._params):
            if p.dtype != torch.float32 or p.device.type != "cpu":
                raise ValueError(f"longhaul.torch.DiLoCo: parameter {i} {tuple(p.shape)} is {p.dtype} on {p.device}; "
                                 "DiLoCo takes float32 CPU parameters")
        self._group = self._resolve(group)
        self.stream = _next_stream() if stream is None else int(stream)
        if not 0 <= self.stream < _MAX_STREAM:
            raise ValueError(f"longhaul.torch.DiLoCo: stream {self.stream} is not in [0, 2^19)")
        self._sync = self._flat().clone()
        self._momentum = torch.zeros_like(self._sync)
        self._steps = 0
        self._rounds = 0
        self._raw = self._wire = 0

    @staticmethod
    def _resolve(group):
        """The longhaul group to average over, or None for a world of one without a process group."""
        if group is None and not dist.is_initialized():
            return None
        return _lht._group(group)  # ValueError unless a longhaul group

    @property
    def param_groups(self):
        return self.inner.param_groups

    @property
    def steps(self):
        """Inner steps taken."""
        return self._steps

    @property
    def rounds(self):
        """Outer steps (sync rounds) taken."""
        return self._rounds

    @property
    def bytes_received(self):
        """Wire bytes (packet headers included) of the pseudo-gradient messages this rank has received, as the link
        meter counts them. Received, not sent: a receive is metered before its all-reduce returns, a send only when
        UCX reports it done, possibly later. longhaul's all-reduces send each rank about what it receives."""
        return self._wire

    @property
    def raw_bytes_received(self):
        """The float32 bytes those messages stood for before the codec (what codec "none" would move)."""
        return self._raw

    def zero_grad(self, set_to_none=None):
        if set_to_none is None:
            self.inner.zero_grad()  # the inner optimizer's own default
        else:
            self.inner.zero_grad(set_to_none=set_to_none)

    def step(self, closure=None):
        loss = self.inner.step(closure) if closure is not None else self.inner.step()
        self._steps += 1
        if self._steps % self.H == 0:
            self.outer_step()
        return loss

    @torch.no_grad()
    def outer_step(self):
        """Averages the pseudo-gradient and takes the outer step now (step() calls it every H steps)."""
        delta = torch.sub(self._sync, self._flat())
        if self._group is not None and self._group.size() > 1:
            before = self._grad_bytes()
            _lht.all_reduce(delta, codec=self.codec, op="avg", group=self._group, stream=self.stream)
            after = self._grad_bytes()
            self._raw += after[0] - before[0]
            self._wire += after[1] - before[1]
        _C.diloco_outer_update(self._sync.data_ptr(), self._momentum.data_ptr(), delta.data_ptr(), self._sync.numel(),
                               self._cfg["outer_lr"], self._cfg["outer_momentum"])
        off = 0
        for p in self._params:
            n = p.numel()
            p.copy_(self._sync[off:off + n].view_as(p))
            off += n
        self._rounds += 1

    def state_dict(self):
        """θ_sync, the outer momentum and the counts; with the model's and the inner optimizer's state dicts a resumed
        run takes the same steps as one never stopped (for codecs without error feedback: the residual of `ef` lives
        in the group's codec stream and is not saved)."""
        return {"sync": self.sync, "codec": self.codec, "theta_sync": self._sync.clone(),
                "momentum": self._momentum.clone(), "steps": self._steps, "rounds": self._rounds,
                "raw_bytes_received": self._raw, "bytes_received": self._wire}

    def load_state_dict(self, state):
        for key in ("theta_sync", "momentum"):
            t = state[key]
            if t.dtype != torch.float32 or t.shape != self._sync.shape:
                raise ValueError(f"longhaul.torch.DiLoCo: state '{key}' is {t.dtype}{tuple(t.shape)}, this model's "
                                 f"parameters are torch.float32({self._sync.numel()},)")
        if state.get("sync", self.sync) != self.sync:
            raise ValueError(f"longhaul.torch.DiLoCo: the state was saved with sync '{state['sync']}', this object "
                             f"runs '{self.sync}'")
        self._sync.copy_(state["theta_sync"])
        self._momentum.copy_(state["momentum"])
        self._steps, self._rounds = int(state["steps"]), int(state["rounds"])
        self._raw, self._wire = int(state.get("raw_bytes_received", 0)), int(state.get("bytes_received", 0))

    def _flat(self):
        if not self._params:
            return torch.zeros(0)
        return torch.cat([p.detach().reshape(-1) for p in self._params])

    def _grad_bytes(self):
        raw = wire = 0
        for link in _lht.link_stats()["links"]:
            if link["role"] == "grad" and link["dir"] == "recv":
                raw += link["raw_bytes"]
                wire += link["wire_bytes"]
        return raw, wire

    def __repr__(self):
        return f"DiLoCo(sync='{self.sync}', codec='{self.codec}', inner={type(self.inner).__name__})"
