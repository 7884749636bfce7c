"""State and checkpoint compatibility of the optimizers: state dicts that load
into torch.optim classes and back, state kept in the dtypes the ops require,
options added after a checkpoint was written, and the layouts of other LAMB
implementations (timm's ``Lamb``, apex's ``FusedLAMB``)."""

from __future__ import annotations

import warnings
from collections import OrderedDict, defaultdict
from typing import Any, ClassVar

import torch
from torch import Tensor
from torch.optim import Optimizer

from ._layout import StateLayout
from ._scheduled import renamed_group_keys, static_address

__all__ = ["CheckpointState", "param_states"]


class _Float8Bits:
    """A float8 tensor as its bytes: ``pickle`` alone cannot load a float8 tensor (torch's
    legacy storage path), so optimizer state travels this way through ``__getstate__``."""

    def __init__(self, t: Tensor) -> None:
        self.bits, self.dtype = t.view(torch.uint8), t.dtype

    def tensor(self) -> Tensor:
        return self.bits.view(self.dtype)


def _map_state(state: Any, fn: Any) -> defaultdict:
    """torch.optim's state (param -> dict of values) with ``fn`` applied to every value of a
    param's dict; other entries (torch allows any, such as a flag a hook writes) as they are."""
    out: defaultdict = defaultdict(dict)
    for p, values in state.items():
        out[p] = {k: fn(v) for k, v in values.items()} if isinstance(values, dict) else values
    return out


def param_states(state: Any) -> Any:
    """The (param, state dict) entries of an optimizer's ``state``, without the other entries
    torch allows in it."""
    return ((p, s) for p, s in state.items() if isinstance(p, Tensor) and isinstance(s, dict))


def _to_bits(v: Any) -> Any:
    return _Float8Bits(v) if isinstance(v, Tensor) and v.dtype in (torch.float8_e4m3fn, torch.float8_e5m2) else v


def _from_bits(v: Any) -> Any:
    return v.tensor() if isinstance(v, _Float8Bits) else v


class CheckpointState(Optimizer):
    """The part of :class:`~inductor_lamb.optim._base.FusedOptimizer` that saves and loads:
    ``state_dict``, ``load_state_dict``, pickling and deep copies."""

    _layout: ClassVar[StateLayout]

    # Options added after 0.1.0 and the values that reproduce what a checkpoint
    # without them did; other missing options take this optimizer's defaults. (Releases up to
    # 0.2.0 rounded bfloat16/float16 params to nearest, and 0.1.0 LAMB16's moments too.)
    _options_before_they_existed: dict[str, Any] = {"stochastic_rounding": False}
    # Instance attributes a copy (pickle, deepcopy) keeps besides torch.optim's defaults, state
    # and param groups; everything else is rebuilt by ``_rebuild`` (plans, the compiled step's
    # handle, indexes by id).
    _copied_attributes: tuple[str, ...] = ()

    def __getstate__(self) -> dict[str, Any]:
        out = dict(super().__getstate__())
        out["state"] = _map_state(out["state"], _to_bits)
        out["_copied"] = {k: self.__dict__[k] for k in self._copied_attributes if k in self.__dict__}
        return out

    def _rebuild(self) -> None:
        """Recreates what a copy does not carry (see ``_copied_attributes``)."""

    def __setstate__(self, state: dict[str, Any]) -> None:
        state = dict(state)
        groups = state.pop("param_groups", None)
        copied = state.pop("_copied", {})
        if "state" in state:
            state["state"] = _map_state(state["state"], _from_bits)
        self.__dict__.update(copied)
        super().__setstate__(state)
        if groups is not None:
            # Options added after a checkpoint was written (not torch.optim's
            # "differentiable", which its __setstate__ puts into the defaults: a
            # state dict must read back as it was saved).
            options = {k: v for k, v in self.defaults.items() if k != "differentiable"}
            for group in groups:
                renamed_group_keys(group)
                for key, value in {**options, **self._options_before_they_existed}.items():
                    group.setdefault(key, value)
            self.param_groups = groups
        self._rebuild()

    # Param-group keys of other implementations that carry nothing these optimizers
    # use (torch.optim's implementation flags), dropped when their state dicts load.
    _foreign_keys: tuple[str, ...] = ("foreach", "fused", "capturable", "differentiable")

    def _adopt_foreign_group(self, group: dict[str, Any], num_groups: int) -> list[str]:
        """Translates, in place, a loaded param group written by another
        implementation of this optimizer; returns what cannot be carried over."""
        return []

    def _from_other_layouts(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        """A state dict from another implementation in this optimizer's layout:
        a per-group ``step`` (timm's Lamb, apex's FusedLAMB) becomes every param's
        ``step``, foreign keys are dropped or translated (``_adopt_foreign_group``),
        with a warning that names what does not carry over. Ours pass unchanged."""
        groups = state_dict["param_groups"]
        if not any("step" in g or any(k in g for k in self._foreign_keys) for g in groups):
            return state_dict
        state = {pid: dict(s) for pid, s in state_dict["state"].items()}
        new_groups, notes = [], []
        for g in groups:
            g = {k: v for k, v in g.items() if k not in self._foreign_keys}
            step = g.pop("step", None)
            if step is not None and self._layout.has_step:
                for pid in g["params"]:
                    if pid in state and "step" not in state[pid]:
                        state[pid]["step"] = torch.as_tensor(step, dtype=torch.float32).clone().reshape(())
            notes += [n for n in self._adopt_foreign_group(g, len(groups)) if n not in notes]
            new_groups.append(g)
        if notes:
            warnings.warn(f"{type(self).__name__}.load_state_dict: " + "; ".join(notes), stacklevel=3)
        return {**state_dict, "state": state, "param_groups": new_groups}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """torch.optim's ``load_state_dict``, in its order: the pre hooks, then the whole load
        (another implementation's layout translated, torch.optim's load, the state put back
        into the dtypes and devices the ops require and marked as static addresses), then the
        post hooks, which see the loaded optimizer and may write into ``state``."""
        state_dict = state_dict.copy()  # (shallow, as torch.optim: a hook may replace entries)
        for pre_hook in self._optimizer_load_state_dict_pre_hooks.values():
            result = pre_hook(self, state_dict)
            if result is not None:
                state_dict = result
        pre, post = self._optimizer_load_state_dict_pre_hooks, self._optimizer_load_state_dict_post_hooks
        # torch.optim's load, with the hooks that already ran or run last set aside (the same dicts
        # are put back: a hook's handle removes it from its dict)
        self._optimizer_load_state_dict_pre_hooks, self._optimizer_load_state_dict_post_hooks = \
            OrderedDict(), OrderedDict()
        try:
            self._load(state_dict)
        finally:
            self._optimizer_load_state_dict_pre_hooks, self._optimizer_load_state_dict_post_hooks = pre, post
        for post_hook in self._optimizer_load_state_dict_post_hooks.values():
            post_hook(self)

    def _load(self, state_dict: dict[str, Any]) -> None:
        state_dict = self._from_other_layouts(state_dict)
        # torch.optim casts floating state to the param dtype (bf16 params would
        # lose their float32 moments, LAMB16's float8 ones would become float32);
        # keep each in the dtype the ops require, from the saved tensors themselves.
        layout = self._layout
        keep = (*layout.state_keys, *layout.scalar_state_keys, "master_param")
        saved = {
            pid: {k: v for k, v in s.items() if k in keep and isinstance(v, Tensor)}
            for pid, s in state_dict["state"].items() if isinstance(s, dict)
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
                state[k] = v.to(device=p.device, dtype=layout.state_dtype(k, p.dtype), copy=True)
                if k in layout.scalar_state_keys and v.numel() == 1:  # (a flat partition's: one per piece)
                    state[k] = state[k].reshape(())
            step = state.pop("step", None)
            if step is not None and layout.has_step:  # (releases up to 0.1.0 kept a dead LARS step)
                step = torch.as_tensor(step, dtype=torch.float32).to(p.device, copy=True)
                state["step"] = step.reshape(()) if step.numel() == 1 else step
        for _, state in param_states(self.state):
            for t in state.values():
                static_address(t)
