"""``OptimizerInfo`` entries for inductor_lamb's optimizers, in the form PyTorch's
own optimizer tests use (``torch.testing._internal.common_optimizers``): each lists
the optimizer's configurations (every option) and the inputs it must reject with
torch.optim's error. ``test_conformance.py`` drives its tests of the
``torch.optim`` contract from them; ``run_torch_optim_suite.py`` adds them to
PyTorch's ``TestOptimRenewed``.
"""

from __future__ import annotations

import torch
from torch.optim.lr_scheduler import ReduceLROnPlateau, StepLR
from torch.testing._internal.common_optimizers import (
    ErrorOptimizerInput,
    OptimizerErrorEnum,
    OptimizerInfo,
    OptimizerInput,
    get_error_inputs_for_all_optims,
)

import inductor_lamb


def _inputs(*configs: tuple[str, dict]) -> list[OptimizerInput]:
    return [OptimizerInput(params=None, kwargs=kwargs, desc=desc) for desc, kwargs in configs]


def _layerwise_inputs(base: dict, *own: tuple[str, dict]) -> list[OptimizerInput]:
    """The cases every layer-wise optimizer has (defaults; ``base`` with a float and a
    Tensor lr, master weights, unscaling in the step) around the optimizer's own
    options, each given on top of ``base``."""
    return _inputs(
        ("default", {}),
        ("non-default lr", base),
        ("Tensor lr", {**base, "lr": torch.tensor(base["lr"])}),
        *((desc, {**base, **kwargs}) for desc, kwargs in own),
        ("master_weights", {**base, "master_weights": True}),
        ("unscale_in_step", {**base, "unscale_in_step": True}),
    )


def _lamb_inputs(device=None, dtype=None):
    return _layerwise_inputs(
        {"lr": 0.01},
        ("betas", {"betas": (0.8, 0.99)}),
        ("no weight_decay", {"weight_decay": 0.0}),
        ("always_adapt", {"weight_decay": 0.0, "always_adapt": True}),
        ("trust_clip", {"trust_clip": True}),
        ("no bias_correction", {"bias_correction": False}),
        ("no grad_averaging", {"grad_averaging": False}),
        ("max_grad_norm", {"max_grad_norm": 0.5}),
        ("decoupled_decay", {"weight_decay": 0.1, "decoupled_decay": True}),
        ("corrected_weight_decay", {"weight_decay": 0.1, "decoupled_decay": True, "corrected_weight_decay": True}),
    )


def _lamb16_inputs(device=None, dtype=None):
    return _layerwise_inputs(
        {"lr": 0.01},
        ("weight_decay", {"weight_decay": 0.1}),
        ("no adaptation", {"trust_scale": 0.0}),
        ("round to nearest", {"stochastic_rounding": False}),
        ("seed", {"seed": 1234}),
    )


def _lars_inputs(device=None, dtype=None):
    # lars_coeff 0.02 (not 0.001) where the test problems are too small for
    # LARS's usual local lr to make progress in a few steps.
    return _layerwise_inputs(
        {"lr": 0.5, "lars_coeff": 0.02},
        ("no momentum", {"momentum": 0.0}),
        ("no weight_decay", {"lr": 0.01, "lars_coeff": 0.001, "weight_decay": 0.0}),
        ("eps", {"eps": 1e-3}),
        ("rescale_grad", {"rescale_grad": 0.5}),
        ("lr outside the momentum", {"lr_in_momentum": False}),
    )


def _adagrad_inputs(device=None, dtype=None):
    return _inputs(
        ("default", {}),
        ("nonzero weight_decay", {"weight_decay": 0.1}),
        ("maximize", {"weight_decay": 0.1, "maximize": True}),
        ("non-default lr", {"lr": 0.1}),
        ("initial_accumulator_value", {"initial_accumulator_value": 0.1, "weight_decay": 0.1}),
        ("lr_decay", {"lr": 0.1, "lr_decay": 0.5, "weight_decay": 0.1}),
        ("Tensor lr", {"lr": torch.tensor(0.001)}),
        ("master_weights", {"lr": 0.1, "master_weights": True}),
        ("unscale_in_step", {"lr": 0.1, "unscale_in_step": True}),
    )


def _novograd_inputs(device=None, dtype=None):
    return _layerwise_inputs(
        {"lr": 0.01},
        ("betas", {"betas": (0.8, 0.99)}),
        ("weight_decay", {"weight_decay": 0.1}),
        ("decoupled_decay", {"weight_decay": 0.1, "decoupled_decay": True}),
        ("grad_averaging", {"grad_averaging": True}),
        ("amsgrad", {"amsgrad": True, "weight_decay": 0.1}),
        ("corrected_weight_decay", {"weight_decay": 0.1, "decoupled_decay": True, "corrected_weight_decay": True}),
    )


def _error(kwargs: dict, error_type: type, regex: str, desc: str = "", params=None) -> ErrorOptimizerInput:
    return ErrorOptimizerInput(OptimizerInput(params=params, kwargs=kwargs, desc=desc or regex),
                               error_type=error_type, error_regex=regex)


def _common_errors(device, dtype) -> list[ErrorOptimizerInput]:
    """torch's errors for every optimizer, and the param dtypes no kernel takes."""
    out = list(get_error_inputs_for_all_optims(device, dtype))
    if torch.device(device).type == "cpu":
        out.append(_error({"lr": -0.01}, ValueError, "Invalid learning rate: -0.01"))
        out.append(ErrorOptimizerInput(
            OptimizerInput(params=[torch.nn.Parameter(torch.zeros(3, dtype=torch.complex64))], kwargs={},
                           desc="complex params"),
            error_type=TypeError, error_regex="supports float32, float64, bfloat16 and float16 params"))
    return out


def _adam_like_errors(device, dtype):
    return [*_common_errors(device, dtype),
            _error({"lr": 1e-2, "betas": (1.0, 0.0)}, ValueError, "Invalid beta parameter at index 0: 1.0"),
            _error({"lr": 1e-2, "betas": (0.9, -0.1)}, ValueError, "Invalid beta parameter at index 1: -0.1"),
            _error({"lr": 1e-2, "eps": -1.0}, ValueError, "Invalid epsilon value: -1.0"),
            _error({"lr": 1e-2, "weight_decay": -1.0}, ValueError, "Invalid weight_decay value: -1.0")]


def _decoupled_decay_errors() -> list[ErrorOptimizerInput]:
    return [_error({"lr": 1e-2, "corrected_weight_decay": True}, ValueError,
                   "corrected_weight_decay=True needs decoupled_decay=True"),
            _error({"lr": 0.0, "decoupled_decay": True, "corrected_weight_decay": True}, ValueError,
                   "corrected_weight_decay=True needs a positive lr")]


def _lamb_errors(device, dtype):
    return [*_adam_like_errors(device, dtype), *_decoupled_decay_errors(),
            _error({"lr": 1e-2, "max_grad_norm": -1.0}, ValueError, "Invalid max_grad_norm value: -1.0")]


def _lamb16_errors(device, dtype):
    return [*_adam_like_errors(device, dtype),
            _error({"lr": 1e-2, "trust_scale": -1.0}, ValueError, "Invalid trust_scale value: -1.0"),
            _error({"lr": 1e-2, "seed": 2**64}, ValueError, "Invalid seed")]


def _lars_errors(device, dtype):
    return [*_common_errors(device, dtype),
            _error({"lr": 1e-2, "momentum": -0.5}, ValueError, "Invalid momentum value: -0.5"),
            _error({"lr": 1e-2, "weight_decay": -0.5}, ValueError, "Invalid weight_decay value: -0.5"),
            _error({"lr": 1e-2, "lars_coeff": -0.5}, ValueError, "Invalid lars_coeff value: -0.5"),
            _error({"lr": 1e-2, "exclude_from_weight_decay": ["bias"]}, ValueError,
                   "exclusions need parameter names", params=[torch.nn.Parameter(torch.randn(2))])]


def _adagrad_errors(device, dtype):
    return [*_common_errors(device, dtype),
            _error({"lr": 1e-2, "lr_decay": -0.5}, ValueError, "Invalid lr_decay value: -0.5"),
            _error({"lr": 1e-2, "weight_decay": -0.5}, ValueError, "Invalid weight_decay value: -0.5"),
            _error({"lr": 1e-2, "initial_accumulator_value": -0.5}, ValueError,
                   "Invalid initial_accumulator_value value: -0.5"),
            _error({"lr": 1e-2, "eps": -0.5}, ValueError, "Invalid epsilon value: -0.5")]


def _novograd_errors(device, dtype):
    return [*_adam_like_errors(device, dtype), *_decoupled_decay_errors(),
            _error({"lr": 1e-2, "norm_type": 0.0}, ValueError, "norm_type=0.0 .* is not supported"),
            _error({"lr": 1e-2, "bias_correction": True}, ValueError, "bias_correction=True .* is not supported"),
            _error({"lr": 1e-2, "init_zero": True}, ValueError, "init_zero=True .* is not supported"),
            _error({"lr": 1e-2, "reg_inside_moment": False}, ValueError,
                   "reg_inside_moment=False .* is not supported: .*decoupled_decay=True")]


_SCHEDULERS = ([lambda opt: StepLR(opt, gamma=0.9, step_size=10), lambda opt: ReduceLROnPlateau(opt)],)


def _info(cls, inputs, errors, **kw) -> OptimizerInfo:
    # No foreach / fused / differentiable flags: every step is fused already.
    return OptimizerInfo(cls, optim_inputs_func=inputs, optim_error_inputs_func=errors, supported_impls=(),
                         not_og_supported_flags=(), supports_complex=False, scheduler_inputs=_SCHEDULERS, **kw)


INFOS: list[OptimizerInfo] = [
    _info(inductor_lamb.Lamb, _lamb_inputs, _lamb_errors),
    _info(inductor_lamb.Lamb16, _lamb16_inputs, _lamb16_errors),
    _info(inductor_lamb.Lars, _lars_inputs, _lars_errors),
    _info(inductor_lamb.Adagrad, _adagrad_inputs, _adagrad_errors, supports_sparse=True,
          metadata_for_sparse=({"lr": 0.1, "weight_decay": 0, "lr_decay": 0}, [])),
    _info(inductor_lamb.NovoGrad, _novograd_inputs, _novograd_errors),
]

__all__ = ["INFOS", "OptimizerErrorEnum"]
