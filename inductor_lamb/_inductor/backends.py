"""The two ways a compiled graph can express an optimizer step: Inductor IR
(the lowering) and ``torch._foreach_*`` ops (the decomposition fallback).

Each optimizer writes its step once, in ``lamb.py`` / ``lars.py`` / ``adagrad.py``,
against the small list-level vocabulary below; a backend turns it into either
Inductor IR nodes or traceable torch ops. So the lowering and the fallback are
the same equations by construction, and both follow the eager in-place order
(a read created after ``assign(x, ...)`` sees the new ``x``).

Arguments of the list ops are lists of tensors (one per param), single tensors
(0-d scalars such as ``lr``) or Python floats; lists are zipped, everything
else is broadcast to every element.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..rounding import PARAM_GRIDS, TensorOps, key_of, round_param, tensor_key

aten = torch.ops.aten


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


class IRBackend(Backend):
    """Inductor IR, built from Inductor's own lowerings of aten ops; device-agnostic
    (C++ on CPU, Triton on GPU)."""

    def __init__(self) -> None:
        from torch._inductor import lowering as L

        self.L = L
        self.lw = L.lowerings

    def _add(self, a, b): return self.lw[aten.add.Tensor](a, b)
    def _sub(self, a, b): return self.lw[aten.sub.Tensor](a, b)
    def _mul(self, a, b): return self.lw[aten.mul.Tensor](a, b)
    def _div(self, a, b): return self.lw[aten.div.Tensor](a, b)
    def _sqrt(self, a): return self.lw[aten.sqrt.default](a)
    def _reciprocal(self, a): return self.lw[aten.reciprocal.default](a)
    def _maximum(self, a, b): return self.lw[aten.clamp_min.default](a, b)
    def _minimum(self, a, b): return self.lw[aten.clamp_max.default](a, b)
    def _pow_scalar(self, base, e):
        e = self.L.to_dtype(e, torch.float64)
        if isinstance(base, (int, float)):
            return self.lw[aten.pow.Scalar](base, e)
        return self.lw[aten.pow.Tensor_Tensor](self.L.to_dtype(base, torch.float64), e)
    def _sumsq(self, a): return self.lw[aten.sum.default](self._mul(a, a))
    def _pow(self, a, e): return self.lw[aten.pow.Tensor_Scalar](a, e)
    def _to_float(self, a): return self.L.to_dtype(a, torch.float32)

    def dtype(self, x): return x.get_dtype()

    def reductions(self, *columns):
        """Each tensor's reductions made one after the other, on a backend with foreach groups:
        Inductor fuses reductions that read the same tensor only when they lie close in its node
        order (it looks 64 nodes ahead), and made column by column, a tensor's reductions lie
        ``len(params)`` or more nodes apart (LAMB16's four came out in four kernels per tensor at
        32 tensors a call, one at 10)."""
        if not self._grouped():
            return super().reductions(*columns)
        fns = {"sumsq": self._sumsq, "absmax": self._absmax}
        out: list[list[Any]] = [[] for _ in columns]
        for i in range(len(columns[0][1])):
            for j, (kind, x) in enumerate(columns):
                out[j].append(self._realized(fns[kind](x[i])))
        return out

    @staticmethod
    def _realized(x):
        x.realize()
        return x

    def _elementwise(self, fn, inputs, dtype):
        from torch._inductor import ir

        like = max(inputs, key=lambda t: len(t.get_size()))
        loaders = [(t.make_loader(), len(t.get_size()) == 0) for t in inputs]

        def inner_fn(index):
            return fn(_IROps, *[load([] if scalar else index) for load, scalar in loaders])

        return ir.Pointwise.create(device=like.get_device(), dtype=dtype, inner_fn=inner_fn,
                                   ranges=list(like.get_size()))

    def _absmax(self, a):
        if a.get_numel() == 0:
            return self.L.full_like(self.lw[aten.sum.default](a), 0.0)
        return self.lw[aten.amax.default](self.lw[aten.abs.default](a), list(range(len(a.get_size()))))

    def _where_positive(self, a, b, then, otherwise):
        both = self.lw[aten.logical_and.default](self.lw[aten.gt.Scalar](a, 0.0), self.lw[aten.gt.Scalar](b, 0.0))
        return self.lw[aten.where.self](both, then, self._as_tensor_like(otherwise, then))

    def _as_tensor_like(self, x, like):
        if isinstance(x, (int, float)):
            return self.L.full_like(like, float(x))
        return x

    def shared(self, a):
        if isinstance(a, list):
            self._foreach([x.realize for x in a])
        else:
            a.realize()
        return a

    def _foreach(self, thunks: list[Callable[[], Any]]) -> None:
        """Runs ``thunks`` (one per param) and, on a backend that fuses foreach groups
        (Triton), registers the operation each one creates last as one group: Inductor then
        makes one kernel of the group (a combo kernel of up to ~250 arguments) instead of one
        per param. Members must not depend on each other, which holds for one list op:
        param i's values read only param i's tensors and the shared inputs."""
        from torch._inductor.virtualized import V

        graph = V.graph
        names: list[str] = []
        for thunk in thunks:
            start = len(graph.operations)
            thunk()
            if len(graph.operations) > start:
                names.append(graph.operations[-1].get_operation_name())
        if len(names) > 1 and self._grouped():
            graph.register_operation_list(names)

    def _grouped(self) -> bool:
        """Whether Inductor's backend for the params' device makes foreach groups (Triton)."""
        from torch._inductor.codegen.common import BackendFeature
        from torch._inductor.virtualized import V

        return self.device is not None and V.graph.has_feature(self.device, BackendFeature.FOREACH)

    device: Any = None  # the params' device (set per call): foreach groups on GPU backends

    def per_tensor(self, values, n):
        """Each param's loops read a [k] buffer of their own holding the k shared
        values. Why: Inductor's scheduler checks every pair of nodes that read a
        common buffer as a fusion candidate (up to 64 neighbours each, about 0.4 ms
        a check, every fusion round), so 0-d inputs read by every param's loops cost
        ~600 checks per param and made fusion most of a cold compile (RESULTS.md).
        Now only the n packet nodes share the inputs, and being alike in
        shape they fuse among themselves in the first round."""
        if not values or n == 0:
            return values
        return self._packets([[x] * n for x in values])

    def scalars(self, *values):
        """One [k] buffer per param holding its k scalars (each scheduler node costs
        compile time: RESULTS.md); floats pass through."""
        columns = [j for j, v in enumerate(values) if not isinstance(v, (int, float))]
        lengths = {len(values[j]) for j in columns if isinstance(values[j], list)}
        if len(lengths) > 1:
            raise ValueError(f"list arguments of different lengths: {sorted(lengths)}")
        n = lengths.pop() if lengths else 1
        if not columns or n == 0:
            return values
        packed = self._packets([values[j] if isinstance(values[j], list) else [values[j]] * n for j in columns])
        out = list(values)
        for j, col in zip(columns, packed):
            out[j] = col if isinstance(values[j], list) else col[0]
        return tuple(out)

    def _packets(self, columns):
        """``columns[j][i]`` (k columns of n float32 0-d or one-element values) as n
        realized [k] buffers, one per param i; returns the k columns of reads of them."""
        from torch._inductor import ir
        from torch._inductor.virtualized import ops

        sel = self.lw[aten.select.int]
        k, n = len(columns), len(columns[0])
        out: list[list[Any]] = [[] for _ in columns]
        packets = []
        for i in range(n):
            row = [col[i] for col in columns]
            for x in row:
                if x.get_dtype() != torch.float32:
                    raise TypeError(f"per-tensor scalars are float32, got {x.get_dtype()}")
            # (grad_scale / found_inf may be one-element 1-d tensors)
            loads = [lambda x=x, load=x.make_loader(): load([0] * len(x.get_size())) for x in row]

            def inner_fn(index, loads=loads):
                j = ops.index_expr(index[0], torch.int32)
                value = loads[-1]()
                for jj in reversed(range(len(loads) - 1)):
                    value = ops.where(ops.eq(j, ops.constant(jj, torch.int32)), loads[jj](), value)
                return value

            packets.append(ir.Pointwise.create(device=row[0].get_device(), dtype=torch.float32, inner_fn=inner_fn,
                                               ranges=[k]))
        self._foreach([x.realize for x in packets])
        for packet in packets:
            for j in range(k):
                out[j].append(sel(packet, 0, j))
        return out

    def pack(self, columns, like, k):
        lw = self.lw
        n = len(columns[0]) if columns else 0
        if n == 0:
            return lw[aten.full.default]([0, k], 0.0, dtype=torch.float32, device=like.get_device())
        cols = [lw[aten.unsqueeze.default](lw[aten.cat.default]([lw[aten.unsqueeze.default](self._to_float(x), 0)
                                                                  for x in col], 0), 1) for col in columns]
        out = lw[aten.cat.default](cols, 1)
        if self.found_inf is not None:
            skip = lw[aten.ne.Scalar](self.item(self.found_inf, 0), 0.0)
            out = lw[aten.where.self](skip, self.L.full_like(out, 0.0), out)
        return out

    def unpack(self, reductions, k):
        sel = self.lw[aten.select.int]
        n = reductions.get_size()[0]
        return [[sel(sel(reductions, 1, j), 0, i) for i in range(n)] for j in range(k)]

    def _assign(self, dst, src) -> None:
        self._foreach([lambda i=i, d=d, s=s: self._assign_one(i, d, s) for i, (d, s) in enumerate(zip(dst, src))])

    def _assign_one(self, i, d, s) -> None:
        dtype = d.get_dtype()
        if self.found_inf is not None:
            skip = self.lw[aten.ne.Scalar](self.item(self.found_inf, i), 0.0)
            if dtype.itemsize == 1:  # float8: Inductor's where cannot promote it; select in float32
                s = self.lw[aten.where.self](skip, self.L.to_dtype(d, torch.float32), self.L.to_dtype(s, torch.float32))
            else:
                s = self.lw[aten.where.self](skip, d, self.L.to_dtype(s, dtype))
        s = self.L.to_dtype(s, dtype)
        # Realizes s straight into d's buffer (no copy kernel); reads created
        # after this see the new value.
        self.L.mutate_to(d, s, unsafe_alias=True)


class TorchBackend(Backend):
    """Traceable torch ops (``torch._foreach_*`` on lists where one exists); used
    as a ``CompositeImplicitAutograd`` decomposition when the lowering cannot be
    installed, so Inductor still fuses the step (slower than the lowering)."""

    _FOREACH = {"_add": torch._foreach_add, "_sub": torch._foreach_sub, "_mul": torch._foreach_mul,
                "_div": torch._foreach_div}

    def _binary(self, name: str, a, b):
        if isinstance(a, list) and (isinstance(b, (list, float, int))):
            return list(self._FOREACH[name](a, b))  # foreach over lists or with a Python scalar
        return _zip_map(getattr(torch, name[1:]), a, b)

    def add(self, a, b): return self._binary("_add", a, b)
    def sub(self, a, b): return self._binary("_sub", a, b)
    def mul(self, a, b): return self._binary("_mul", a, b)
    def div(self, a, b): return self._binary("_div", a, b)

    def sqrt(self, a): return list(torch._foreach_sqrt(a)) if isinstance(a, list) else torch.sqrt(a)

    def pow_scalar(self, base, exponent):
        if isinstance(base, torch.Tensor):
            base = base.double()
            return _zip_map(lambda e: torch.pow(base, e.double()), exponent)
        if isinstance(exponent, list):
            return list(torch._foreach_pow(base, [e.double() for e in exponent]))
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
        torch._foreach_copy_(dst, src)


class _IROps:
    """The same operations inside an Inductor IR node's inner function (``ops.*``
    values: each computed once and reused)."""

    @staticmethod
    def _c(x):
        from torch._inductor.virtualized import ops

        if isinstance(x, bool):
            return ops.constant(x, torch.bool)
        if isinstance(x, int):
            return ops.constant(x, torch.int64)
        if isinstance(x, float):
            return ops.constant(x, torch.float32)
        return x

    @staticmethod
    def _ops():
        from torch._inductor.virtualized import ops

        return ops

    @classmethod
    def bits(cls, x):
        o = cls._ops()
        return o.bitwise_and(o.to_dtype(o.to_dtype_bitcast(x, torch.int32, torch.float32), torch.int64),
                             cls._c(0xFFFFFFFF))
    @classmethod
    def from_bits(cls, a):
        o = cls._ops()
        signed = o.sub(a, o.bitwise_left_shift(o.bitwise_right_shift(a, cls._c(31)), cls._c(32)))
        return o.to_dtype_bitcast(o.to_dtype(signed, torch.int32), torch.float32, torch.int32)
    @classmethod
    def code(cls, x, dtype):
        o = cls._ops()
        return o.to_dtype(o.to_dtype_bitcast(x, torch.uint8, dtype), torch.int64)
    @classmethod
    def to_int(cls, x): return cls._ops().to_dtype(x, torch.int64)
    @classmethod
    def to_float(cls, x): return cls._ops().to_dtype(x, torch.float32)
    @classmethod
    def umul(cls, a, c): return cls.band(cls._ops().mul(a, cls._c(c)), 0xFFFFFFFF)
    @classmethod
    def shl(cls, a, k): return cls.band(cls._ops().bitwise_left_shift(a, cls._c(k)), 0xFFFFFFFF)

    def _binary(name: str):  # noqa: N805  (a class-body helper: ops.<name>(a, b), b a value or a constant)
        return classmethod(lambda cls, a, b: getattr(cls._ops(), name)(a, cls._c(b)))

    shr, xor, band, bor = _binary("bitwise_right_shift"), _binary("bitwise_xor"), _binary("bitwise_and"), \
        _binary("bitwise_or")
    add, sub, mul, less_than = _binary("add"), _binary("sub"), _binary("mul"), _binary("lt")
    del _binary

    @classmethod
    def where(cls, m, a, b): return cls._ops().where(m, a, b)


def scaled_grads(B: Backend, grads: list[Any], grad_scale: Any, factor: float = 1.0, max_grad_norm: float = 0.0):
    """float32 ``grads * factor / grad_scale``, clipped by their global norm when
    ``max_grad_norm > 0`` (the grad handling every op shares)."""
    g = B.to_float(grads)
    mul = None if grad_scale is None else B.scalar(B.mul(B.reciprocal(grad_scale), factor))
    if factor != 1.0 and mul is None:
        g = B.mul(g, factor)
    if mul is not None:
        g = B.mul(g, mul)
    if max_grad_norm > 0:
        total = None
        for sq in B.sumsq(g):
            total = sq if total is None else B.add(total, sq)
        (clip,) = B.per_tensor([B.scalar(B.maximum(B.div(B.sqrt(total), max_grad_norm), 1.0))], len(g))
        g = B.div(g, clip)
    return g


def master_or_params(B: Backend, params: list[Any], master_params: list[Any] | None):
    """The float32 params the math reads: the master copies when given."""
    return list(master_params) if master_params is not None else B.to_float(params)


def assign_params(B: Backend, params: list[Any], master_params: list[Any] | None, new: list[Any],
                  rounding: Callable[[int, Any, Any, torch.dtype], Any] | None = None) -> None:
    """The new params (float32): into the master copies if any, then into the params.
    ``rounding`` (:func:`param_rounding`): bf16 / fp16 params without master copies are
    rounded stochastically onto their grid first, as the kernels do."""
    B.assign(master_params, new)
    if rounding is not None and master_params is None:
        p0 = B.to_float(params)
        new = [rounding(i, x, p0[i], B.dtype(p)) if B.dtype(p) in PARAM_GRIDS else x
               for i, (p, x) in enumerate(zip(params, new))]
    B.assign(params, new)


def param_rounding(B: Backend, a: Any, hash_in: list[Any] | None = None, steps: list[Any] | None = None,
                   hashes: list[Any] | None = None) -> Callable[[int, Any, Any, torch.dtype], Any] | None:
    """How :func:`assign_params` rounds param ``i`` when the op rounds params stochastically:
    with the per-tensor keys from ``steps`` as this step counts them (None: LARS, step 0) and
    ``hash_in``, the op's per-element hash input; or with LAMB16's element ``hashes``
    (csrc/common/rounding.h param_hash)."""
    if not a.stochastic_rounding or a.master_params is not None:
        return None
    if hashes is not None:
        return lambda i, x, p0, dtype: round_param(B, dtype, x, p0, hashes=hashes[i])
    keys = key_of(a.seed) if steps is None else tensor_key(B, a.seed, steps)
    return lambda i, x, p0, dtype: round_param(B, dtype, x, p0, key=B.item(keys, i), hash_in=hash_in[i])


def increment_steps(B: Backend, steps: list[Any]) -> list[Any]:
    """``steps += 1`` in place (skipped with ``found_inf``, like everything); returns the
    steps as written. (Not ``steps + 1``: with ``found_inf`` the assign writes a select of
    old and new, and an unrealized ``steps + 1`` read after it would add to the new steps.)"""
    B.assign(steps, B.add(steps, 1.0))
    return list(steps)
