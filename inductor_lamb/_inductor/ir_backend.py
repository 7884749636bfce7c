"""The lowering's backend: the step as Inductor IR, built from Inductor's own lowerings of aten
ops (C++ on CPU, Triton on GPU), and the operations namespace of its element functions."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from .. import _private
from .backend import Backend

__all__ = ["IRBackend"]

aten = torch.ops.aten


class IRBackend(Backend):
    """Inductor IR, built from Inductor's own lowerings of aten ops; device-agnostic
    (C++ on CPU, Triton on GPU)."""

    def __init__(self) -> None:
        L = _private.inductor_lowering()
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
        ir = _private.inductor_ir()

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
        V = _private.inductor_virtualized().V

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
        BackendFeature = _private.backend_feature()
        V = _private.inductor_virtualized().V

        return self.device is not None and V.graph.has_feature(self.device, BackendFeature.FOREACH)

    device: Any = None  # the params' device (set per call): foreach groups on GPU backends

    def per_tensor(self, values, n):
        """Each param's loops read a [k] buffer of their own holding the k shared
        values. Why: Inductor's scheduler checks every pair of nodes that read a
        common buffer as a fusion candidate (up to 64 neighbours each, every fusion
        round), so 0-d inputs read by every param's loops made fusion most of a cold
        compile (docs/decisions.md, "Compile time: what the scheduler and gcc see").
        Now only the n packet nodes share the inputs, and being alike in
        shape they fuse among themselves in the first round."""
        if not values or n == 0:
            return values
        return self._packets([[x] * n for x in values])

    def scalars(self, *values):
        """One [k] buffer per param holding its k scalars (each scheduler node costs
        compile time: docs/decisions.md, "Compile time"); floats pass through."""
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
        ir = _private.inductor_ir()
        ops = _private.inductor_virtualized().ops

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
        self._foreach([functools.partial(self._assign_one, i, d, s) for i, (d, s) in enumerate(zip(dst, src))])

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


class _IROps:
    """The same operations inside an Inductor IR node's inner function (``ops.*``
    values: each computed once and reused)."""

    @staticmethod
    def _c(x):
        ops = _private.inductor_virtualized().ops

        if isinstance(x, bool):
            return ops.constant(x, torch.bool)
        if isinstance(x, int):
            return ops.constant(x, torch.int64)
        if isinstance(x, float):
            return ops.constant(x, torch.float32)
        return x

    @staticmethod
    def _ops():
        ops = _private.inductor_virtualized().ops

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

    @staticmethod
    def _binary(name: str) -> Any:  # (a class-body helper: ops.<name>(a, b), b a value or a constant)
        return classmethod(lambda cls, a, b: getattr(cls._ops(), name)(a, cls._c(b)))

    shr, xor, band, bor = _binary("bitwise_right_shift"), _binary("bitwise_xor"), _binary("bitwise_and"), \
        _binary("bitwise_or")
    add, sub, mul, less_than = _binary("add"), _binary("sub"), _binary("mul"), _binary("lt")
    del _binary

    @classmethod
    def where(cls, m, a, b): return cls._ops().where(m, a, b)
