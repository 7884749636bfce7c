"""What every inductor_lamb optimizer shares: a 0-d tensor lr per param group,
(device, dtype) buckets for the list ops, GradScaler support, float32 state
that survives ``load_state_dict``, and a ``step`` that never graph-breaks.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor
from torch.optim import Optimizer

__all__ = ["FusedOptimizer", "as_lr_tensor", "check_betas", "check_nonnegative"]

_LOW_PRECISION = (torch.bfloat16, torch.float16)


def as_lr_tensor(lr: float | Tensor, device: torch.device | str = "cpu") -> Tensor:
    """``lr`` as a 0-d float32 tensor on ``device``: schedulers then update it in
    place (``fill_``), so a changing learning rate never recompiles a graph, and
    on a GPU the kernels read it there (no host sync, CUDA-graph capturable)."""
    device = torch.device(device)
    if isinstance(lr, Tensor):
        if lr.numel() != 1:
            raise ValueError(f"lr must be a float or a 1-element tensor, got shape {tuple(lr.shape)}")
        if lr.dim() == 0 and lr.dtype == torch.float32 and lr.device == device:
            return lr
        return lr.detach().reshape(()).to(device=device, dtype=torch.float32)
    lr = float(lr)
    if not lr >= 0.0:
        raise ValueError(f"Invalid learning rate: {lr}")
    return torch.tensor(lr, dtype=torch.float32, device=device)


def check_betas(betas: tuple[float, float]) -> None:
    """torch.optim's check and message for Adam-style betas."""
    for i, beta in enumerate(betas):
        if not 0.0 <= beta < 1.0:
            raise ValueError(f"Invalid beta parameter at index {i}: {beta}")


def check_nonnegative(**values: float) -> None:
    """Raises torch.optim's ``Invalid <name> value`` for a negative hyper-parameter."""
    names = {"eps": "epsilon"}
    for name, value in values.items():
        if not 0.0 <= value:
            raise ValueError(f"Invalid {names.get(name, name)} value: {value}")


def _group_device(group: dict[str, Any]) -> torch.device:
    """Where a group's lr lives: its params' device when they share one, else the CPU."""
    devices = {p.device for p in group["params"]}
    return devices.pop() if len(devices) == 1 else torch.device("cpu")


class FusedOptimizer(Optimizer):
    """Base of the optimizers whose step is one ``torch.ops.lamb`` call per
    (device, dtype) bucket of each param group.

    Subclasses set ``_state_keys`` (state tensors created like the param,
    float32 unless ``_state_dtypes`` says otherwise, zero-filled unless
    ``_state_fill`` says otherwise), optionally ``_scalar_state_keys`` (0-d
    float32 per-param state, e.g. LAMB16's scales), and implement ``_step_bucket``.
    """

    # GradScaler passes grad_scale / found_inf as attributes (like torch's fused Adam)
    # instead of unscaling the grads in a separate pass.
    _step_supports_amp_scaling = True
    _state_keys: tuple[str, ...] = ()
    _state_dtypes: dict[str, torch.dtype] = {}
    _scalar_state_keys: tuple[str, ...] = ()

    def __init__(self, params: Iterable[Any], defaults: dict[str, Any]) -> None:
        as_lr_tensor(defaults["lr"])  # validates
        # Counts step() calls; a tensor because compiled code keeps in-place tensor
        # updates but drops attribute writes on optimizers.
        self._steps_taken = torch.zeros((), dtype=torch.int64)
        super().__init__(params, defaults)

    # ---- param groups and state -------------------------------------------------

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        # Each group gets its own lr tensor unless the user handed one in.
        if not isinstance(group["lr"], Tensor) or group["lr"] is self.defaults["lr"]:
            group["lr"] = as_lr_tensor(group["lr"], _group_device(group)).clone()
        for p in group["params"]:
            if p.dtype not in (torch.float32, *_LOW_PRECISION):
                raise TypeError(
                    f"{type(self).__name__} supports float32, bfloat16 and float16 params, got {p.dtype}"
                )
        # State is created now rather than at the first step (as torch.optim does): a
        # compiled training step then sees the same state from its first call and
        # compiles once. Master copies stay lazy (they copy the param's value, which
        # may still be loaded after the optimizer is built).
        for p in group["params"]:
            if p.requires_grad:
                self._init_state(p, group, master=False)

    def _init_state(self, p: Tensor, group: dict[str, Any], master: bool = True) -> dict[str, Any]:
        state = self.state[p]
        if len(state) == 0:
            # step on the param's device, as the op reads it there (no host sync on GPU)
            state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
            for key in self._state_keys:
                state[key] = torch.full_like(
                    p, self._state_fill(key, group), dtype=self._state_dtype(key),
                    memory_format=torch.preserve_format,
                )
            for key in self._scalar_state_keys:
                state[key] = torch.full((), self._state_fill(key, group), dtype=torch.float32, device=p.device)
        if master and "master_param" not in state and group.get("master_weights", False) and p.dtype in _LOW_PRECISION:
            state["master_param"] = p.detach().to(torch.float32, memory_format=torch.preserve_format)
        return state

    def _state_fill(self, key: str, group: dict[str, Any]) -> float:
        """Initial value of state tensor ``key``."""
        return 0.0

    def _state_dtype(self, key: str) -> torch.dtype:
        return self._state_dtypes.get(key, torch.float32)

    def state_bytes_per_param(self) -> float:
        """Bytes of optimizer state (every tensor in ``self.state``: moments,
        scales, steps, master copies) per optimized parameter element; 0.0 when
        no state exists yet."""
        nbytes = numel = 0
        for p, state in self.state.items():
            numel += p.numel()
            nbytes += sum(v.numel() * v.element_size() for v in state.values() if isinstance(v, Tensor))
        return nbytes / numel if numel else 0.0

    def state_dict(self) -> dict[str, Any]:
        # lr as a float, like torch.optim's own optimizers save it: checkpoints
        # load into torch.optim classes too (load_state_dict turns it back into a tensor).
        sd = super().state_dict()
        for group in sd["param_groups"]:
            if isinstance(group.get("lr"), Tensor):
                group["lr"] = float(group["lr"])
        return sd

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        # torch.optim casts floating state to the param dtype (bf16 params would
        # lose their float32 moments, LAMB16's float8 ones would become float32);
        # keep each in the dtype the ops require, from the saved tensors themselves.
        keep = (*self._state_keys, *self._scalar_state_keys, "master_param")
        saved = {
            pid: {k: v for k, v in s.items() if k in keep and isinstance(v, Tensor)}
            for pid, s in state_dict["state"].items()
        }
        super().load_state_dict(state_dict)
        id_to_param = {
            pid: p
            for saved_group, group in zip(state_dict["param_groups"], self.param_groups)
            for pid, p in zip(saved_group["params"], group["params"])
        }
        for pid, values in saved.items():
            p = id_to_param.get(pid)
            if p is None:
                continue
            state = self.state[p]
            for k, v in values.items():
                state[k] = v.to(device=p.device, dtype=self._state_dtype(k), copy=True)
                if k in self._scalar_state_keys:
                    state[k] = state[k].reshape(())
            step = state.get("step")
            if step is not None:
                state["step"] = torch.as_tensor(step, dtype=torch.float32).to(p.device, copy=True).reshape(())
        for group in self.param_groups:
            group["lr"] = as_lr_tensor(group["lr"], _group_device(group)).clone()

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Resets the gradients of all optimized tensors, like
        ``torch.optim.Optimizer.zero_grad``; unlike it (``@torch._disable_dynamo``)
        dynamo can trace it, so a whole training step compiles as one graph."""
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if set_to_none:
                    p.grad = None
                else:
                    if p.grad.grad_fn is not None:
                        p.grad.detach_()
                    else:
                        p.grad.requires_grad_(False)
                    p.grad.zero_()

    # ---- step ----------------------------------------------------------------------

    def _buckets(self, group: dict[str, Any]) -> dict[tuple[torch.device, torch.dtype], dict[str, list[Tensor]]]:
        """Params with a grad, with their state, grouped by (device, dtype)."""
        buckets: dict[tuple[torch.device, torch.dtype], dict[str, list[Tensor]]] = defaultdict(
            lambda: defaultdict(list)
        )
        names = group.get("param_names")  # set when built from model.named_parameters()
        for i, p in enumerate(group["params"]):
            if p.grad is None:
                continue
            if p.grad.is_sparse:
                raise RuntimeError(f"{type(self).__name__} does not support sparse gradients")
            state = self._init_state(p, group)
            b = buckets[(p.device, p.dtype)]
            b["params"].append(p)
            b["grads"].append(p.grad)
            b["steps"].append(state["step"])
            b["names"].append(names[i] if names else None)
            for key in (*self._state_keys, *self._scalar_state_keys):
                b[key].append(state[key])
            if "master_param" in state:
                b["master_params"].append(state["master_param"])
        return buckets

    def _amp_args(self, device: torch.device) -> tuple[Tensor | None, Tensor | None]:
        """grad_scale / found_inf set by torch.amp.GradScaler for this step, on ``device``."""
        grad_scale = getattr(self, "grad_scale", None)
        found_inf = getattr(self, "found_inf", None)
        if grad_scale is not None:
            grad_scale = grad_scale.to(device=device, dtype=torch.float32, non_blocking=True)
        if found_inf is not None:
            found_inf = found_inf.to(device=device, dtype=torch.float32, non_blocking=True)
        return grad_scale, found_inf

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Performs a single optimization step.

        Args:
            closure: a closure that re-evaluates the model and returns the loss.
        """
        loss = None
        self._steps_taken.add_(1)
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            if not isinstance(group["lr"], Tensor):  # set by hand to a float
                group["lr"] = as_lr_tensor(group["lr"], _group_device(group))
            buckets = self._buckets(group)
            # Clipping by the group's global grad norm: the op does it when the
            # group is one bucket; across buckets the clip folds into grad_scale.
            max_norm = float(group.get("max_grad_norm", 0.0))
            clip = self._clip_factor(buckets, max_norm) if max_norm > 0 and len(buckets) > 1 else None
            for (device, _), bucket in buckets.items():
                grad_scale, found_inf = self._amp_args(device)
                if clip is not None:
                    clip_d = clip.to(device)
                    grad_scale = clip_d if grad_scale is None else grad_scale * clip_d
                self._step_bucket(group, bucket, grad_scale, found_inf, max_norm if clip is None else 0.0)
        return loss

    # LR schedulers wrap ``opt.step`` in a function of lr_scheduler.py (only to set
    # ``_opt_called``), a file dynamo refuses to trace: a fullgraph compile of a
    # training step would fail. The marker tells schedulers to leave our step
    # unwrapped, and ``_opt_called`` is derived from the state instead (dynamo
    # drops attribute writes on optimizers inside compiled code).
    step._wrapped_by_lr_sched = True  # type: ignore[attr-defined]

    @property
    def _opt_called(self) -> bool:
        # Read by LR schedulers once, on their first step (eagerly).
        return bool(self._steps_taken > 0)

    @_opt_called.setter
    def _opt_called(self, value: bool) -> None:
        pass  # derived from the state, see above

    def _clip_factor(self, buckets: dict[Any, dict[str, list[Tensor]]], max_norm: float) -> Tensor:
        """max(1, ||all grads / grad_scale|| / max_norm) over every bucket of a group."""
        total = torch.zeros((), dtype=torch.float64)
        for (device, _), bucket in buckets.items():
            norms = torch._foreach_norm(bucket["grads"], 2, dtype=torch.float32)
            total = total + torch.stack(norms).double().square().sum().cpu()
            grad_scale, _ = self._amp_args(device)
        norm = total.sqrt()
        if grad_scale is not None:
            norm = norm / grad_scale.double().cpu()
        return (norm / max_norm).clamp(min=1.0).float()

    @staticmethod
    def _bucket_lr(group: dict[str, Any], bucket: dict[str, list[Tensor]]) -> Tensor:
        """The group's lr on the bucket's device (a copy only for mixed-device groups)."""
        lr, device = group["lr"], bucket["params"][0].device
        return lr if lr.device == device else lr.to(device, non_blocking=True)

    def _step_bucket(
        self,
        group: dict[str, Any],
        bucket: dict[str, list[Tensor]],
        grad_scale: Tensor | None,
        found_inf: Tensor | None,
        max_grad_norm: float,
    ) -> None:
        """One op call for one (device, dtype) bucket of ``group``."""
        raise NotImplementedError
