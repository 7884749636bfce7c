"""The vocabulary every optimizer's compiled step is written in, once: :class:`Backend`.

Each optimizer writes its step once, in ``lamb.py`` / ``lamb16.py`` / ``lars.py`` /
``adagrad.py``, against the small list-level vocabulary below (with the pieces every op shares in
``step_parts.py``); a backend turns it into Inductor IR nodes (``ir_backend.py``, the lowering) or
traceable torch ops (``torch_backend.py``, the decomposition fallback, also the reference's
implementation). So the lowering and the fallback are the same equations by construction, and both
follow the eager in-place order (a read created after ``assign(x, ...)`` sees the new ``x``).

Arguments of the list ops are lists of tensors (one per param), single tensors
(0-d scalars such as ``lr``) or Python floats; lists are zipped, everything
else is broadcast to every element.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

__all__ = ["Backend"]


def _zip_map(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn`` element-wise over the list arguments (others broadcast); a single
    result when no argument is a list."""
    lengths = {len(a) for a in args if isinstance(a, list)}
    if not lengths:
        return fn(*args)
    if len(lengths) != 1:
        raise ValueError(f"list arguments of different lengths: {sorted(lengths)}")
    (n,) = lengths
    return [fn(*(a[i] if isinstance(a, list) else a for a in args)) for i in range(n)]


class Backend:
    """The vocabulary the optimizer math is written in."""

    found_inf: Any = None  # 0-d tensor; when nonzero every assign keeps the old value

    # What each backend implements on one value (the public methods zip them over lists)
    _add: Callable[[Any, Any], Any]
    _sub: Callable[[Any, Any], Any]
    _mul: Callable[[Any, Any], Any]
    _div: Callable[[Any, Any], Any]
    _sqrt: Callable[[Any], Any]
    _reciprocal: Callable[[Any], Any]
    _maximum: Callable[[Any, float], Any]
    _minimum: Callable[[Any, float], Any]
    _where_positive: Callable[[Any, Any, Any, Any], Any]
    _pow_scalar: Callable[[Any, Any], Any]
    _sumsq: Callable[[Any], Any]
    _absmax: Callable[[Any], Any]
    _pow: Callable[[Any, float], Any]
    _to_float: Callable[[Any], Any]
    _elementwise: Callable[[Callable[..., Any], list[Any], torch.dtype], Any]
    _assign: Callable[[list[Any], Any], None]

    def add(self, a, b): return _zip_map(self._add, a, b)
    def sub(self, a, b): return _zip_map(self._sub, a, b)
    def mul(self, a, b): return _zip_map(self._mul, a, b)
    def div(self, a, b): return _zip_map(self._div, a, b)
    def sqrt(self, a): return _zip_map(self._sqrt, a)
    def reciprocal(self, a): return _zip_map(self._reciprocal, a)
    def maximum(self, a, b: float): return _zip_map(self._maximum, a, b)
    def minimum(self, a, b: float): return _zip_map(self._minimum, a, b)
    def where_positive(self, a, b, then, otherwise):
        """``then`` where ``a > 0 and b > 0``, else ``otherwise`` (element-wise)."""
        return _zip_map(self._where_positive, a, b, then, otherwise)
    def pow_scalar(self, base, exponent):
        """``base ** exponent`` in float64 (like the C++ kernels: ``1 - beta2**t`` loses
        digits in float32), for a float or 0-d tensor ``base``; ``to_float`` it after
        the float64 math on it."""
        return _zip_map(self._pow_scalar, base, exponent)
    def sumsq(self, a): return _zip_map(self._sumsq, a)
    def absmax(self, a):
        """max |a| over each tensor (0 for an empty one): float8 scales."""
        return _zip_map(self._absmax, a)
    def pow(self, a, exponent: float): return _zip_map(lambda x: self._pow(x, exponent), a)
    def to_float(self, a): return _zip_map(self._to_float, a)

    def reductions(self, *columns: tuple[str, list[Any]]) -> list[list[Any]]:
        """A layer-wise op's per-tensor reductions: ``columns`` of (``"sumsq"`` or ``"absmax"``,
        a list of tensors); one list of 0-d values per column."""
        return [getattr(self, kind)(x) for kind, x in columns]

    def dtype(self, x) -> torch.dtype:
        """The storage dtype of tensor ``x``."""
        raise NotImplementedError

    def one_minus(self, a): return self.add(self.mul(a, -1.0), 1.0)

    def elementwise(self, fn: Callable[..., Any], inputs: list[Any], dtype: torch.dtype) -> Any:
        """``fn(o, *values)`` per element over ``inputs`` (lists zipped, others
        broadcast; a 0-d input broadcasts to every element), ``o`` the operations
        namespace of this backend (``rounding.TensorOps``, ``_IROps``): integer math for LAMB16's
        stochastic rounding (inductor_lamb/rounding.py), written once per element."""
        return _zip_map(lambda *xs: self._elementwise(fn, list(xs), dtype), *inputs)

    def scalar(self, a):
        """Marks per-tensor scalar math (beta powers, trust ratios) to be computed
        once, not inside every element loop that uses it."""
        return self.shared(a)

    def shared(self, a):
        """Marks values computed once from the inputs as they are now, for readers
        that may come after an assign to those inputs (the IR re-reads an unrealized
        value's inputs at each use)."""
        return a

    def per_tensor(self, values: list[Any], n: int) -> list[Any]:
        """The 0-d tensors ``values`` (lr, betas, grad_scale, found_inf: shared by
        every param) as the math of each of the ``n`` params should read them: the
        values themselves (broadcast), or one list of ``n`` per-param copies each
        (IRBackend, for compile time)."""
        return values

    def scalars(self, *values: Any) -> tuple[Any, ...]:
        """Per-tensor float32 scalars (0-d values, lists of them, or Python floats),
        marked like :meth:`scalar`, but all of one param's in one buffer (IRBackend:
        one node per param instead of one per value, for compile time)."""
        return tuple(self.scalar(v) if not isinstance(v, (int, float)) else v for v in values)

    @staticmethod
    def item(x: Any, i: int) -> Any:
        """Param ``i``'s value of ``x``: ``x[i]`` for a per-param list, else ``x``."""
        return x[i] if isinstance(x, list) else x

    def pack(self, columns: list[list[Any]], like: Any, k: int) -> Any:
        """A two-phase op's reductions: ``columns[j][i]`` (k columns of n 0-d values; no
        columns when n == 0) as one float32 [n, k] tensor on ``like``'s device; zeros
        when ``found_inf`` is set (like the kernels)."""
        raise NotImplementedError

    def unpack(self, reductions: Any, k: int) -> list[list[Any]]:
        """``pack``'s inverse: k columns of n 0-d values."""
        raise NotImplementedError

    def assign(self, dst: Sequence[Any] | None, src: Sequence[Any]) -> None:
        """``dst[i] = src[i]`` in place (cast to ``dst``'s dtype), skipped when
        ``found_inf`` is set."""
        if dst is None:
            return
        self._assign(list(dst), src)
