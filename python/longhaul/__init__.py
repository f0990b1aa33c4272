"""longhaul from Python: codecs on torch tensors (longhaul.codecs) and the "longhaul" backend of
torch.distributed (import longhaul.torch). See docs/torch.md."""
import torch as _torch  # noqa: F401  (torch's own types must be registered before the extension loads)

from . import _C  # noqa: F401
from . import codecs

__all__ = ["codecs"]
