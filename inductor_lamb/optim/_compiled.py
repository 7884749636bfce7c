"""``torch.compile(opt.step)`` on the CPU: the compiled step runs the eager, planned step.

A compiled ``opt.step`` has nothing to fuse: every tensor it reads is a graph input (the
grads come from a backward outside the graph) and the kernels already run each bucket as one
pass over memory. What compiling adds is host cost per tensor: Dynamo's guards on every
param, grad and state tensor, and the generated wrapper's size and stride check of every
input (five inputs a LAMB param), which on small params costs several times the step itself.
torch's fused optimizers pay the same: their compiled ``opt.step`` calls their eager kernel
with every tensor as an input.

So when the step is the whole compiled function (``torch.compile(opt.step)``), its graph is one
call of ``torch.ops.lamb._eager_step`` on an opaque handle of the optimizer (a reference-type
opaque object: Dynamo guards its type, not its contents), and that op runs the eager step:
the planned op calls (:mod:`._plan`), with every check the eager step makes, no recompile
when grads appear or disappear, and the same bits. The op is ordered (an effect token), so
Inductor never drops or moves it.

The handle hides the params, grads and state from the graph, which is only sound where nothing
else in the graph reads or writes them and nothing replays the graph against other grads:

- the compiled function is the optimizer's ``step`` itself (not a function that calls it,
  whose graph may compute the grads or read the params), with no step hooks and no closure;
- every param is a plain CPU tensor: a CUDA graph (``mode="reduce-overhead"``) bakes the
  grads' addresses into its replays, so CUDA steps keep their tensors in the graph, as
  static inputs; DTensor steps keep their collectives in the graph.

Anything else traces the op calls with their tensors, as before.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

__all__ = ["AVAILABLE", "StepHandle", "eager_step", "applies"]

# Opaque reference objects: torch 2.14 names them "symbolic custom classes", torch 2.10 to 2.13
# "reference opaque types" (2.14 still takes the old names, with a warning).
try:
    from torch._custom_class_base import CustomClassBase as OpaqueBase
    from torch._library.opaque_object import register_custom_class

    def register_opaque_type(cls: type) -> None:
        register_custom_class(cls, typ="symbolic")
except ImportError:
    try:
        from torch._library.opaque_object import register_opaque_type as _register
        from torch._opaque_base import OpaqueBase

        def register_opaque_type(cls: type) -> None:
            _register(cls, typ="reference")
    except ImportError:  # pragma: no cover - older torch: every compiled step traces its op calls
        OpaqueBase, register_opaque_type = object, None  # type: ignore[assignment,misc]


class StepHandle(OpaqueBase):  # type: ignore[misc, valid-type]
    """An optimizer as an opaque object of the compiled graph (a weak reference: the graph
    must not keep the optimizer alive)."""

    def __init__(self, opt: Any) -> None:
        self._opt = weakref.ref(opt)

    def step(self) -> None:
        opt = self._opt()
        if opt is None:
            raise RuntimeError("inductor_lamb: the optimizer of this compiled step no longer exists")
        opt.step()  # (eager: the graph runs with Dynamo off)

    def __reduce__(self) -> Any:
        # (Inductor pickles a graph's inputs into its cache key: the handle's identity is not
        # part of the graph, which takes it at run time)
        return (_dead_handle, ())


def _dead_handle() -> StepHandle:
    return StepHandle.__new__(StepHandle)


def _define_op() -> Any:
    """Registers the handle type and defines ``lamb::_eager_step`` (None where this torch's
    custom-class API differs: compiled steps then trace their op calls)."""
    register_opaque_type(StepHandle)

    @torch.library.custom_op("lamb::_eager_step", mutates_args=())
    def eager_step(handle: StepHandle) -> None:
        """The eager step of the optimizer ``handle`` refers to (see the module docstring)."""
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("inductor_lamb: a compiled CPU step cannot be captured in a CUDA graph")
        # The step as eager code runs it: a custom op's kernel runs with ADInplaceOrView excluded,
        # which would skip the version bumps of every tensor the step writes (autograd must see
        # them, docs/design.md).
        key = torch._C.DispatchKey.ADInplaceOrView
        excluded = torch._C._dispatch_tls_is_dispatch_key_excluded(key)
        torch._C._dispatch_tls_set_dispatch_key_excluded(key, False)
        try:
            handle.step()
        finally:
            torch._C._dispatch_tls_set_dispatch_key_excluded(key, excluded)

    @eager_step.register_fake
    def _(handle: StepHandle) -> None:
        return None

    from torch._higher_order_ops.effects import _EffectType, _register_effectful_op

    _register_effectful_op(torch.ops.lamb._eager_step.default, _EffectType.ORDERED)
    return eager_step


eager_step: Any = None
if register_opaque_type is not None:
    try:
        eager_step = _define_op()
    except Exception:  # noqa: BLE001  (an older or newer custom-class API: never break the import)
        eager_step = None
AVAILABLE = eager_step is not None


def _root_code() -> Any:
    """The code object of the frame torch.compile is compiling (run by Dynamo while it
    traces; see :func:`applies`)."""
    from torch._dynamo.symbolic_convert import InstructionTranslator

    tx = InstructionTranslator.current_tx()
    return None if tx is None else tx.f_code


def _is_root(code: Any) -> bool:
    try:
        return _root_code() is code
    except Exception:  # noqa: BLE001  (moved Dynamo internals: trace the op calls)
        return False


def applies(opt: Any) -> bool:
    """Whether a step of ``opt`` that Dynamo traces now becomes one :func:`eager_step` call:
    the frame being compiled is ``opt.step`` itself and all of ``opt``'s params are plain
    CPU tensors (``opt._host_params``, kept by ``add_param_group``). Traced code: what it
    reads becomes the compiled step's guards (an attribute and the step hooks, never a
    tensor)."""
    if not AVAILABLE or not opt._host_params:
        return False
    return _step_is_compiled_alone()


# The code of every optimizer's patched ``step`` (FusedOptimizer.profile_hook_step's wrapper,
# what ``torch.compile(opt.step)`` compiles); _base sets it.
step_wrapper_code: Any = None


def _step_is_compiled_alone() -> bool:
    # The compiled frame is an optimizer's step wrapper: the same answer for every compile of
    # that frame, so a constant, not a guard.
    return _is_root(step_wrapper_code)


# (torch._dynamo.assume_constant_result, without importing Dynamo with the package)
_step_is_compiled_alone._dynamo_marked_constant = True  # type: ignore[attr-defined]
