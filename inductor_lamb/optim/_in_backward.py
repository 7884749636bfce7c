"""The step inside the backward: each param steps as soon as the backward has made its final grad,
which is then freed, so a training step never holds every grad at once.

A layer-wise step needs nothing global: a param's trust ratio (LAMB, LAMB16), local lr (LARS) or
layer-wise second moment (NovoGrad) reads only its own grad, and Adagrad is element-wise. So the
step of a param can run the moment its grad is final.

How: a post-accumulate-grad hook on every param of the optimizer (it fires once per backward,
after the last contribution to the grad, also for a param used twice) collects the param into
a batch; a batch of ``bucket_bytes`` of grads steps as one fused call per bucket
(``FusedOptimizer._step_batch``: the :class:`~._route.Route` ``IN_BACKWARD``, planned like a
whole group's step), and its grads are freed. Params whose hooks another caller runs together
(FSDP2, for a group's params after their reduce-scatter) are one batch, whatever its size. The end of the backward (the autograd engine's
queued callback) steps what is left. ``opt.step()`` then finds no grads left (it steps what did
not step in the backward) and ``opt.zero_grad()`` none to free: a training loop stays as it was.

What cannot work is refused before anything steps:

- clipping by a norm over several params (``max_grad_norm``): the first grads are stepped and
  freed before the last are made; ``torch.nn.utils.clip_grad_norm_`` (and ``clip_grad_value_``)
  after such a backward, which would find no grads and clip nothing;
- ``torch.amp.GradScaler``: its inf check would come after the params stepped with the scaled
  grads, and a partial update cannot be undone. Its ``step`` is refused (the backward before it
  has stepped: build the scaler, or this, not both; bfloat16 autocast needs no scaler);
- a second backward that steps before ``opt.step()`` or ``opt.zero_grad()`` ends the training step
  (gradient accumulation stepping on every micro-batch): accumulate inside :meth:`no_step`, which
  leaves the grads to the next backward, like DDP's ``no_sync``;
- plain params in a process group of several ranks (DDP averages the grads after the backward;
  the step would read one rank's grad). DTensor params (FSDP2) step with their sharded grads.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import weakref
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor

from .. import _private

__all__ = ["StepInBackward", "step_in_backward"]

# Grads a batch collects before it steps (measured, benchmarks/bench_in_backward.py): smaller
# batches keep fewer grads alive at once; below a few MiB, the host cost of more op calls shows
# on small tensors.
DEFAULT_BUCKET_BYTES = 8 * 2**20


class StepInBackward:
    """The handle :func:`step_in_backward` returns: :meth:`remove` returns to ordinary steps,
    :meth:`no_step` accumulates grads; also a context manager (removed on exit)."""

    def __init__(self, opt: Any, bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> None:
        from ._base import FusedOptimizer

        if not isinstance(opt, FusedOptimizer):
            raise TypeError(f"step_in_backward takes an inductor_lamb optimizer (Lamb, Lamb16, Lars, NovoGrad, "
                            f"Adagrad), got {type(opt).__name__}")
        if opt._in_backward is not None:
            raise RuntimeError(f"{type(opt).__name__} already steps in the backward: remove() its handle first")
        if isinstance(bucket_bytes, bool) or not isinstance(bucket_bytes, int) or bucket_bytes < 0:
            raise ValueError(f"step_in_backward: bucket_bytes must be an int >= 0, got {bucket_bytes!r}")
        self.optimizer = opt
        self.bucket_bytes = bucket_bytes
        self._check_clipping()
        self._groups: list[list[Tensor]] = []  # each hooked group's params list
        self._hooked: dict[int, weakref.ref[Tensor]] = {}  # every hooked param by id() (what clipping refuses)
        self._hooks: list[Any] = []
        self._hook_new_groups()
        self._pending: dict[int, list[int]] = {}
        self._pending_bytes = 0
        self._caller: Any = None   # who ran the pending params' hooks (_private.hook_caller)
        self._tasks: set[int] = set()  # the graph tasks of the backward running now (a reentrant one's too)
        self._open = 0             # of those, the ones whose end has not run
        self._lock = threading.RLock()
        self._stepped = False      # a backward stepped since the last opt.step() / zero_grad()
        self._paused = 0           # depth of no_step()
        self._traced: list[tuple[int, int, Tensor]] = []  # compiled autograd's hooks, traced so far
        self._scaling = opt._step_supports_amp_scaling
        # GradScaler then hands its scale to step() (which refuses it) instead of asserting on
        # finding no grads to unscale.
        opt._step_supports_amp_scaling = True
        opt._in_backward = self
        _activate(self)

    # ---- what users call -----------------------------------------------------------------

    def remove(self) -> None:
        """Back to ordinary steps: the hooks are removed (call it between training steps)."""
        if self.optimizer._in_backward is not self:
            return
        for h in self._hooks:
            h.remove()
        self._hooks = []
        self.optimizer._step_supports_amp_scaling = self._scaling
        self.optimizer._in_backward = None
        _deactivate(self)

    @contextlib.contextmanager
    def no_step(self) -> Iterator[None]:
        """Backward passes inside only accumulate grads (gradient accumulation's micro-batches,
        like DDP's ``no_sync``); the first backward after it steps with the accumulated grads."""
        self._paused += 1
        try:
            yield
        finally:
            self._paused -= 1

    def __enter__(self) -> StepInBackward:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()

    # ---- the hooks -------------------------------------------------------------------------

    def _hook_new_groups(self) -> None:
        """Hooks the params of groups added since (``add_param_group``): each hook knows its
        param's place (no lookup by identity, which a trace of the hook could not follow)."""
        groups = self.optimizer.param_groups
        for index in range(len(self._groups), len(groups)):
            params = groups[index]["params"]
            self._groups.append(params)
            for place, p in enumerate(params):
                if p.requires_grad:
                    self._hooked[id(p)] = weakref.ref(p)
                    self._hooks.append(p.register_post_accumulate_grad_hook(self._hook(index, place)))

    def _hook(self, index: int, place: int) -> Any:
        def hook(p: Tensor) -> None:
            if self._paused:
                return
            if torch.compiler.is_compiling():
                # Compiled autograd traces the hooks into its backward graph, but moves each one
                # to right after its param's grad is made, before the backward's last read of
                # the param (measured on torch 2.13): a step there would change grads still to
                # come. The steps are traced at the graph's end (its final callbacks) instead.
                # The checks run while tracing (what they read is guarded).
                if not self._traced:
                    self._check(p)
                    if not _private.compiling_fullgraph():
                        raise RuntimeError(
                            "step_in_backward under compiled autograd needs its backward compiled with "
                            "fullgraph=True: the steps run where the graph ends (its final callbacks), which "
                            "compiled autograd traces only in a full graph")
                    _private.queue_callback(self._end_traced)
                self._traced.append((index, place, p))
            else:
                with self._lock:  # (a backward over several devices runs hooks on a thread each)
                    self._ready(p, index, place)

        return hook

    def _end_traced(self) -> None:
        """The end of a backward graph traced by compiled autograd: its params step there."""
        traced, self._traced = self._traced, []
        self._stepped = True
        for index, place, p in traced:
            # (the param as the graph has it: the group's would be a second input aliasing it)
            self.optimizer._step_batch({index: [place]}, params=[p])

    def _ready(self, p: Tensor, index: int, place: int) -> None:
        """A param's grad is final (its post-accumulate-grad hook, run eagerly)."""
        if self._open == 0:
            if _private.in_compiled_autograd():  # (the traced hook's refusal made a graph break there)
                raise RuntimeError(
                    "step_in_backward under compiled autograd needs its backward compiled with fullgraph=True: "
                    "compiled autograd runs each hook right after its grad is made, before the backward's last "
                    "read of the param, and only a full graph steps the params where it ends")
            self._check(p)
            self._pending.clear()  # (left by a backward that failed: their grads stay for opt.step())
            self._pending_bytes = 0
            self._caller = None
        task = _private.graph_task_id()
        if task not in self._tasks:
            # The first hook of a backward, or of a backward run inside it (a reentrant
            # checkpoint's): each one's end steps what is left; the pass ends with the last.
            self._tasks.add(task)
            self._open += 1
            _private.queue_callback(self._end)
        if self._groups[index][place] is not p:
            raise RuntimeError(f"step_in_backward: param {place} of {type(self.optimizer).__name__}'s param group "
                               f"{index} was replaced since it was hooked; remove() the handle before changing "
                               "the groups, and hook them again")
        caller = _private.hook_caller()
        if caller is not self._caller:
            # Params handed over together (FSDP2 runs the hooks of a group's params after their
            # reduce-scatter) step as one batch: one collective of partial norms a group. Those
            # handed over before, by another caller, are complete.
            self._step_pending()
            self._caller = caller
        self._pending.setdefault(index, []).append(place)
        self._pending_bytes += p.numel() * p.element_size()  # (a DTensor's global size: the same on every rank)
        if caller is None and self._pending_bytes >= self.bucket_bytes:  # (autograd's own: a hook per grad made)
            self._step_pending()

    def _check(self, p: Tensor) -> None:
        """Before the first step of a backward: what cannot step inside it is refused."""
        opt = self.optimizer
        if self._stepped:
            raise RuntimeError(
                f"{type(opt).__name__} stepped in the last backward, and this backward would step again before "
                "opt.step() or opt.zero_grad() ended the training step: for gradient accumulation (or a "
                "backward of another loss through these params: a GAN's, an adversarial input's), run it inside "
                "handle.no_step() (its grads accumulate; the next backward steps with them)")
        if torch.is_grad_enabled():
            raise RuntimeError(f"step_in_backward: a backward with create_graph=True cannot step {type(opt).__name__}'s "
                               "params inside it (their grads are part of a graph); run it inside handle.no_step()")
        self._check_clipping()
        groups = opt.param_groups
        if any(groups[i]["params"] is not params for i, params in enumerate(self._groups[:len(groups)])) or \
                len(groups) < len(self._groups):
            raise RuntimeError(f"step_in_backward: {type(opt).__name__}'s param groups changed since its params were "
                               "hooked; remove() the handle before changing them, and hook them again")
        self._hook_new_groups()
        if _several_ranks():  # (every param: the first hooks may be a DTensor's, a later one a plain's)
            plain = next(((i, j) for i, params in enumerate(self._groups) for j, q in enumerate(params)
                          if q.requires_grad and not _is_dtensor(q)), None)
            if plain is not None:
                raise RuntimeError(
                    f"step_in_backward: param {plain[1]} of {type(opt).__name__}'s param group {plain[0]} is a "
                    f"plain tensor in a process group of {torch.distributed.get_world_size()} ranks: DDP averages "
                    "the grads after the backward, and a step inside it would read this rank's own. Step after "
                    "the backward (remove the handle), or shard the params with FSDP2 (fully_shard), whose hooks "
                    "run after the reduce-scatter")

    def _end(self) -> None:
        """The end of a backward (or of one run inside it): what is left steps."""
        with self._lock:
            self._open -= 1
            self._step_pending()
            if self._open == 0:
                self._tasks.clear()
                self._caller = None

    def _step_pending(self) -> None:
        if not self._pending:
            return
        batch = {index: sorted(places) for index, places in self._pending.items()}
        self._pending = {}
        self._pending_bytes = 0
        self._stepped = True
        self.optimizer._step_batch(batch)

    # ---- step() and zero_grad() --------------------------------------------------------------

    def boundary(self, opt: Any) -> None:
        """``opt.step()`` or ``opt.zero_grad()``: the end of a training step."""
        stepped, self._stepped = self._stepped, False
        self._open, self._tasks = 0, set()  # (a backward that raised never ran its end)
        if stepped and (getattr(opt, "grad_scale", None) is not None or getattr(opt, "found_inf", None) is not None):
            for name in ("grad_scale", "found_inf"):  # (GradScaler deletes them only after a step returns)
                if name in opt.__dict__:
                    delattr(opt, name)
            raise RuntimeError(
                f"torch.amp.GradScaler cannot drive {type(opt).__name__} stepping in the backward: the params have "
                "already stepped with the scaled grads, before the scaler could check them for infs and skip "
                "the step. Use bfloat16 autocast (no scaler), or step after the backward (remove the handle)")

    def _check_clipping(self) -> None:
        opt = self.optimizer
        values = ([("defaults", opt.defaults)] if opt._clip_spans_groups
                  else [(f"param_groups[{i}]", g) for i, g in enumerate(opt.param_groups)])
        for where, group in values:
            if float(group.get("max_grad_norm") or 0.0) > 0:
                raise ValueError(
                    f"{type(opt).__name__}: {where}['max_grad_norm'] is {group['max_grad_norm']}: clipping by the "
                    "norm of several grads cannot run inside the backward, which steps and frees the first grads "
                    "before the last are made. Set it to 0, or step after the backward")


# A backward run eagerly inside a compiled function (after its graph break at ``backward()``) runs
# the hooks as frames Dynamo would compile, one per param: they run eagerly, with all they call,
# and compiled autograd still inlines them into its graph.
_private.run_eagerly_as_a_frame(StepInBackward._hook(None, 0, 0))  # type: ignore[arg-type]


# ---- clipping after the backward -------------------------------------------------------------
# torch.nn.utils.clip_grad_norm_ / clip_grad_value_ skip params without a grad: after a backward
# that stepped, they would clip nothing and return a norm of 0 (what frameworks log, and how
# clipping silently did nothing in other steps-in-the-backward). While a handle is active they
# refuse such params by name. (Code that drops the params without grads before calling torch, as
# accelerate's clip_grad_norm_ does, cannot be seen: HF Trainer's max_grad_norm, docs.)
_ACTIVE: weakref.WeakSet[StepInBackward] = weakref.WeakSet()  # (a dropped handle does not count)
_CLIPS = ("clip_grad_norm_", "clip_grad_value_")
_ORIGINAL: dict[tuple[Any, str], Any] = {}  # (module, name): torch's function


def _refusing(name: str, clip: Any) -> Any:
    @functools.wraps(clip)
    def wrapper(parameters: Any, *args: Any, **kwargs: Any) -> Any:
        params = [parameters] if isinstance(parameters, Tensor) else list(parameters)
        for handle in _ACTIVE:
            if handle._stepped and any(_hooked_by(handle, p) for p in params):
                raise RuntimeError(
                    f"torch.nn.utils.{name} after a backward in which {type(handle.optimizer).__name__} stepped "
                    "its params and freed their grads (step_in_backward): there is nothing left to clip. Clip "
                    "inside the optimizer (max_grad_norm) only when stepping after the backward; with "
                    "step_in_backward, leave clipping off (HF Trainer: max_grad_norm=0; Lightning: no "
                    "gradient_clip_val; timm: no --clip-grad)")
        return clip(params, *args, **kwargs)

    wrapper._refuses_after_step_in_backward = True  # type: ignore[attr-defined]
    return wrapper


def _hooked_by(handle: StepInBackward, p: Tensor) -> bool:
    ref = handle._hooked.get(id(p))
    return ref is not None and ref() is p


def _activate(handle: StepInBackward) -> None:
    if not _ACTIVE:  # (torch's functions as they are now: another library may have wrapped them)
        for name in _CLIPS:
            for module in (torch.nn.utils, torch.nn.utils.clip_grad):  # (two functions on some releases)
                if hasattr(module, name):
                    current = getattr(module, name)
                    while getattr(current, "_refuses_after_step_in_backward", False):  # (left by dropped handles)
                        current = current.__wrapped__
                    _ORIGINAL[(module, name)] = current
                    setattr(module, name, _refusing(name, current))
    _ACTIVE.add(handle)


def _deactivate(handle: StepInBackward) -> None:
    _ACTIVE.discard(handle)
    if not _ACTIVE:
        for (module, name), original in _ORIGINAL.items():
            if getattr(getattr(module, name), "__wrapped__", None) is original:  # (only ours is undone)
                setattr(module, name, original)
        _ORIGINAL.clear()


def _several_ranks() -> bool:
    dist = torch.distributed
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _is_dtensor(p: Tensor) -> bool:
    from ._sharding import dtensor_type

    dtensor = dtensor_type()
    return dtensor is not None and isinstance(p, dtensor)


def step_in_backward(opt: Any, *, bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> StepInBackward:
    """Makes every ``loss.backward()`` step ``opt``'s params as the backward makes their grads,
    and free those grads: a training step never holds every grad at once.

    One line added to an ordinary loop; ``opt.step()`` and ``opt.zero_grad()`` stay (they step
    and free what did not step in the backward), LR schedulers drive ``opt`` as before, and its
    state dicts are the ordinary ones. The params step with the bits of an ordinary step.

    Args:
        opt: an inductor_lamb optimizer.
        bucket_bytes: the grads (in bytes) a batch collects before it steps as one fused call
            per bucket; what is left steps at the end of the backward. 0: every param steps
            alone, as soon as its grad is made. (Under FSDP2 each group's params step as one
            batch, as its reduce-scatter hands them over, whatever their size.)

    Returns:
        A handle: ``handle.remove()`` returns to ordinary steps, ``with handle.no_step():``
        accumulates grads over micro-batches (the next backward steps with them); as a context
        manager, it is removed on exit.

    Raises:
        ValueError: a param group clips by a grad norm (``max_grad_norm``).
        RuntimeError: at a backward, or the ``step`` after it, that cannot step in the backward
            (see :mod:`inductor_lamb.optim._in_backward`): GradScaler, a second stepping backward
            before the training step ended, plain params in several ranks (DDP).
    """
    return StepInBackward(opt, bucket_bytes)
