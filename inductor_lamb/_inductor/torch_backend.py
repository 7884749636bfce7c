"""The decomposition's backend: the step as traceable torch ops (``torch._foreach_*`` on lists
where one exists); also what ``inductor_lamb.reference`` runs."""

from __future__ import annotations

import torch

from .. import _private
from ..rounding import TensorOps
from .backend import Backend, _zip_map

__all__ = ["TorchBackend"]


class TorchBackend(Backend):
    """Traceable torch ops (``torch._foreach_*`` on lists where one exists); used
    as a ``CompositeImplicitAutograd`` decomposition when the lowering cannot be
    installed, so Inductor still fuses the step (slower than the lowering)."""

    def _binary(self, name: str, a, b):
        if isinstance(a, list) and (isinstance(b, (list, float, int))):
            return list(_private.foreach(name[1:])(a, b))  # foreach over lists or with a Python scalar
        return _zip_map(getattr(torch, name[1:]), a, b)

    def add(self, a, b): return self._binary("_add", a, b)
    def sub(self, a, b): return self._binary("_sub", a, b)
    def mul(self, a, b): return self._binary("_mul", a, b)
    def div(self, a, b): return self._binary("_div", a, b)

    def sqrt(self, a): return list(_private.foreach("sqrt")(a)) if isinstance(a, list) else torch.sqrt(a)

    def pow_scalar(self, base, exponent):
        if isinstance(base, torch.Tensor):
            base = base.double()
            return _zip_map(lambda e: torch.pow(base, e.double()), exponent)
        if isinstance(exponent, list):
            return list(_private.foreach("pow")(base, [e.double() for e in exponent]))
        return torch.pow(base, exponent.double())

    def _reciprocal(self, a): return torch.reciprocal(a)
    def _maximum(self, a, b): return torch.clamp_min(a, b)
    def _minimum(self, a, b): return torch.clamp_max(a, b)
    # _foreach_norm has no Inductor lowering (it would stay an external call).
    def _sumsq(self, a): return (a * a).sum()
    def _absmax(self, a): return a.abs().amax() if a.numel() else a.new_zeros(())
    def _pow(self, a, e): return torch.pow(a, e)
    def _to_float(self, a): return a.float()

    def dtype(self, x): return x.dtype

    def _where_positive(self, a, b, then, otherwise):
        return torch.where((a > 0) & (b > 0), then, otherwise)

    def _elementwise(self, fn, inputs, dtype):
        return fn(TensorOps, *inputs).to(dtype)

    def pack(self, columns, like, k):
        if not columns or not columns[0]:
            return torch.zeros((0, k), dtype=torch.float32, device=like.device)
        out = torch.stack([torch.stack([x.float() for x in col]) for col in columns], dim=1)
        return out if self.found_inf is None else torch.where(self.found_inf != 0, 0.0, out)

    def unpack(self, reductions, k):
        return [list(reductions[:, j].unbind(0)) for j in range(k)]

    def _assign(self, dst, src) -> None:
        if self.found_inf is not None:
            skip = self.found_inf != 0
            # (float8 through float32: Inductor cannot promote a where on float8)
            src = [torch.where(skip, d, s.to(d.dtype)) if d.dtype.itemsize > 1 else torch.where(skip, d.float(), s.float())
                   for d, s in zip(dst, src)]
        _private.foreach("copy_")(dst, src)
