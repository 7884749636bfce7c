"""Every private torch symbol inductor_lamb uses, and the only place that reaches them.

torch keeps no promise about names with a leading underscore: a release may move or drop any
of them. Reaching them through this module gives each a name here, one line in
:data:`SYMBOLS` (what the package uses and why), and a test that resolves every line and fails
loudly, naming the symbol, when a torch release moves one (``tests/test_private_api.py``, run
under every supported torch). A feature that must do without one warns once, saying what is
lost (:func:`warn_once`); none falls back silently.

Nothing here imports Dynamo or Inductor at import time (about 2 s that every eager process
would pay): the accessors import on first use, which is always inside a compile.
"""

from __future__ import annotations

import functools
import importlib
import sys
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from . import _versions

__all__ = ["LIMITS", "RELEASE", "lacks", "SYMBOLS", "PROTOCOLS", "resolve", "global_step_hooks", "foreach", "functional_collectives", "strided_shard",
           "OpOverload", "warn_once", "disable_dynamo", "compiling_fullgraph", "backward_traced", "in_compiled_autograd",
           "graph_task_id", "hook_caller", "queue_callback",
           "run_eagerly_as_a_frame",
           "constant_under_dynamo", "mark_static_address", "dispatch_keys", "PYTHON_KEY", "CHECK_KEYS",
           "has_kernel_for", "inductor", "inductor_ir", "inductor_lowering", "inductor_virtualized",
           "inductor_config", "custom_graph_pass", "backend_feature", "disable_current_modes"]

# Every private symbol, by the name this module gives it: (dotted path, what it is used for).
# The path is "module:attribute.attribute" (a module alone has no colon).
SYMBOLS: dict[str, tuple[str, str]] = {
    # ---- Dynamo: how a step is compiled (optim/_route.py)
    "disable_dynamo": ("torch:_disable_dynamo",
                       "a compiled step with nothing to fuse graph-breaks and runs eagerly, as torch.optim's "
                       "fused optimizers do (lazily imports Dynamo on first call, unlike torch.compiler.disable)"),
    "InstructionTranslator.current_tx": (
        "torch._dynamo.symbolic_convert:InstructionTranslator.current_tx",
        "whether the frame being compiled refuses graph breaks (fullgraph=True): then the step is traced"),
    "set_code_exec_strategy": (
        "torch._C._dynamo.eval_frame:set_code_exec_strategy",
        "the param_groups property runs eagerly when torch code that Dynamo skips (an LR scheduler) reads "
        "it inside a compiled function, instead of compiling frames that guard every param"),
    "_FrameExecStrategy": ("torch._C._dynamo.eval_frame:_FrameExecStrategy", "(its argument)"),
    "_FrameAction": ("torch._C._dynamo.eval_frame:_FrameAction", "(SKIP: the frame and its callees)"),
    # ---- autograd's engine (optim/_in_backward.py)
    "_current_graph_task_id": ("torch._C:_current_graph_task_id",
                               "the backward a hook of step_in_backward runs in (a reentrant one's is new)"),
    "_current_autograd_node": (
        "torch._C:_current_autograd_node",
        "who runs a hook of step_in_backward: FSDP2 hands a group's params over together (one batch)"),
    "AccumulateGrad": ("torch._C:_functions.AccumulateGrad",
                       "(the node of autograd's own grad accumulation, which runs a hook per param)"),
    "queue_callback": ("torch.autograd:Variable._execution_engine.queue_callback",
                       "what is left steps at the end of the backward (as FSDP2 and DDP finish theirs)"),
    "in_compiled_autograd_region": (
        "torch._dynamo.compiled_autograd:in_compiled_autograd_region",
        "a hook of step_in_backward run eagerly inside compiled autograd's graph (a graph break there) "
        "refuses to step: compiled autograd moves the hook before the backward's last read of the param"),
    "trace_autograd_ops": ("torch._dynamo.config:trace_autograd_ops",
                           "a backward traced into the step's graph (recipe (a)): its buckets are traced too"),
    # ---- torch.optim (optim/_base.py)
    "_global_optimizer_pre_hooks": ("torch.optim.optimizer:_global_optimizer_pre_hooks",
                                    "a traced step runs the global step hooks, as torch.optim's wrapper does"),
    "_global_optimizer_post_hooks": ("torch.optim.optimizer:_global_optimizer_post_hooks", "(the same)"),
    # ---- ops (ops.py, spec.py, _inductor/cache_key.py)
    "OpOverload": ("torch._ops:OpOverload", "an op's overload: its schema, its name, the type of a graph's call"),
    # ---- foreach ops (the decomposition's backend, optim/_base.py's clip norm)
    **{f"_foreach_{name}": (f"torch:_foreach_{name}", "the decomposition's list math; the clip's grad norms")
       for name in ("add", "sub", "mul", "div", "sqrt", "pow", "copy_", "norm")},  # (the names of _FOREACH)
    # ---- DTensor and collectives (optim/_sharding.py)
    "functional_collectives": ("torch.distributed._functional_collectives",
                               "traceable all_reduce / all_gather: a compiled sharded step keeps them in its graph"),
    "_StridedShard": ("torch.distributed.tensor.placement_types:_StridedShard",
                      "FSDP2 over tensor parallel shards along a mesh dimension with it (TorchTitan's 2-D "
                      "layouts): its shards' partials combine like Shard(d)'s"),
    # ---- the dispatcher (ops.py, optim/_plan.py, _inductor/paths.py)
    "DispatchKey": ("torch._C:DispatchKey", "the check kernels' key (PrivateUse3); the Python key of a subclass"),
    "DispatchKeySet": ("torch._C:DispatchKeySet", "redispatch to the check kernels from the fake implementations"),
    "_dispatch_keys": ("torch._C:_dispatch_keys", "a step plan takes plain tensors only (no Python key)"),
    "_dispatch_has_kernel_for_dispatch_key": (
        "torch._C:_dispatch_has_kernel_for_dispatch_key", "the auto path calls the CUDA kernel only where it is built"),
    "Argument": ("torch._C:Argument", "an op's schema arguments, read into its OpSpec"),
    "_disable_current_modes": ("torch.utils._python_dispatch:_disable_current_modes",
                               "installing the compile paths from inside a trace, outside its fake mode"),
    # ---- Inductor: the lowering (the _inductor package)
    "inductor.ir": ("torch._inductor.ir", "the lowering's IR nodes (Pointwise, Reduction, InputBuffer, views)"),
    "inductor.lowering": ("torch._inductor.lowering",
                          "register_lowering, lowerings, fallback_handler and the aten lowerings the IR backend uses"),
    "inductor.virtualized": ("torch._inductor.virtualized", "V (the graph being lowered) and ops (the IR's ops)"),
    "inductor.config": ("torch._inductor.config", "post_grad_custom_post_pass: the cache-key pass"),
    "inductor.custom_graph_pass": ("torch._inductor.custom_graph_pass:CustomGraphPass",
                                   "the base class of the cache-key pass (its uuid keys the FX graph cache)"),
    "inductor.BackendFeature": ("torch._inductor.codegen.common:BackendFeature",
                                "whether the device's codegen takes foreach groups"),
}

# Private attributes that torch reads or writes on our objects (a protocol, not a symbol to
# resolve): name -> (the torch module whose source names it, what it does for us).
PROTOCOLS: dict[str, tuple[str, str]] = {
    "_dynamo_marked_constant": ("torch._dynamo.decorators",
                                "set by assume_constant_result: Dynamo calls a marked function while tracing and "
                                "keeps its result as a constant (set here without importing Dynamo)"),
    "_dynamo_static_input_type": ("torch._dynamo.decorators",
                                  "set by mark_static_address: optimizer state is a static input of a compiled "
                                  "step (CUDA graphs), set here without importing Dynamo"),
    "_init_group": ("torch._dynamo.variables.optimizer",
                    "Dynamo runs an optimizer's _init_group eagerly while tracing its step"),
    "_wrapped_by_lr_sched": ("torch.optim.lr_scheduler", "LR schedulers leave a step that carries it unwrapped"),
    "_opt_called": ("torch.optim.lr_scheduler", "what LR schedulers read to warn of a scheduler step before any"),
    "_step_supports_amp_scaling": ("torch.amp.grad_scaler",
                                   "GradScaler hands grad_scale and found_inf to a step that unscales itself"),
    "_optimizer_step_pre_hooks": ("torch.optim.optimizer", "the step hooks a traced step runs"),
    "_optimizer_step_post_hooks": ("torch.optim.optimizer", "(the same)"),
    "_optimizer_load_state_dict_pre_hooks": ("torch.optim.optimizer",
                                             "load_state_dict runs them before the optimizer's whole load"),
    "_optimizer_load_state_dict_post_hooks": ("torch.optim.optimizer", "... and these after it"),
}

_T = TypeVar("_T")

# What a supported release cannot do, by feature: (the first release that can, why). The package
# avoids the feature on an older torch where it has another way (``lacks``), and refuses a user's
# explicit choice of it, naming the release.
LIMITS: dict[str, tuple[tuple[int, int], str]] = {
    "lowering_cuda": ((2, 12), "its Inductor asserts in the loop reordering after fusion on the lowering's fused "
                               "CUDA nodes (pytorch/pytorch#176591, fixed in 2.12)"),
}
RELEASE = _versions.release(torch.__version__)


def lacks(feature: str) -> str | None:
    """Why this torch cannot do ``feature`` (a :data:`LIMITS` key), or None when it can."""
    first, why = LIMITS[feature]
    if RELEASE >= first:
        return None
    return f"torch {torch.__version__} cannot: {why}"


def resolve(name: str) -> Any:
    """The object :data:`SYMBOLS` names ``name`` (imports its module); raises ``AttributeError`` /
    ``ImportError`` naming the symbol when this torch lacks it."""
    path = SYMBOLS[name][0]
    module_name, _, attrs = path.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as e:
        raise ImportError(f"inductor_lamb needs torch's private module {module_name} ({name}), which torch "
                          f"{torch.__version__} does not have") from e
    for attr in filter(None, attrs.split(".")):
        if not hasattr(obj, attr):
            raise AttributeError(f"inductor_lamb needs torch's private {path} ({name}), which torch "
                                 f"{torch.__version__} does not have")
        obj = getattr(obj, attr)
    return obj


_warned: set[str] = set()


def warn_once(feature: str, lost: str, error: BaseException | None = None) -> None:
    """One ``RuntimeWarning`` per process and feature: what falls back and what is lost."""
    if feature in _warned:
        return
    _warned.add(feature)
    why = f" ({type(error).__name__}: {error})" if error is not None else ""
    warnings.warn(f"inductor_lamb: {feature} is not available with torch {torch.__version__}{why}; {lost}",
                  RuntimeWarning, stacklevel=3)


# ---- Dynamo ------------------------------------------------------------------------------------


def disable_dynamo(fn: Callable[..., _T]) -> Callable[..., _T]:
    """``fn`` run eagerly wherever Dynamo meets it (a graph break; torch's own fused optimizers'
    way), imports Dynamo only when first called."""
    return resolve("disable_dynamo")(fn)


def constant_under_dynamo(fn: Callable[[], _T]) -> Callable[[], _T]:
    """Marks a no-argument function that Dynamo calls while tracing and keeps the result of as
    a constant (``torch._dynamo.assume_constant_result``, without importing Dynamo)."""
    fn._dynamo_marked_constant = True  # type: ignore[attr-defined]
    return fn


@constant_under_dynamo
def compiling_fullgraph() -> bool:
    """Whether the frame Dynamo is tracing refuses graph breaks (``fullgraph=True``, or
    ``torch._dynamo.error_on_graph_break``). Where this torch's tracer differs: True (the
    step is then traced, which is always sound), with a warning."""
    try:
        tx = resolve("InstructionTranslator.current_tx")()
        return bool(tx.one_graph or tx.error_on_graph_break)
    except Exception as e:  # noqa: BLE001  (moved Dynamo internals: warned, then traced)
        warn_once("telling a fullgraph compile apart", "a compiled opt.step traces its op calls instead of "
                  "running the eager step (correct, slower on many small params)", e)
        return True


def run_eagerly_as_a_frame(fn: Callable[..., Any]) -> None:
    """Dynamo runs ``fn`` eagerly, with everything it calls, when it meets ``fn`` as a frame of
    its own (called from code it does not trace, such as an LR scheduler inside a compiled
    function), and still inlines ``fn`` where it traces the caller (which a
    ``torch.compiler.disable`` would turn into a graph break). Sets the code's frame strategy in
    torch's C extension: no Dynamo import. Without it, such a frame is compiled: correct, slower
    (warned)."""
    try:
        strategy, action = resolve("_FrameExecStrategy"), resolve("_FrameAction")
        resolve("set_code_exec_strategy")(fn.__code__, strategy(action.SKIP, action.SKIP))
    except Exception as e:  # noqa: BLE001  (moved internals: warned, still correct)
        warn_once("running the param_groups property eagerly inside compiled code",
                  "an LR scheduler stepped inside a compiled function costs guards on every param", e)


def graph_task_id() -> int:
    """The running backward's graph task (a new one per ``backward()``, and per backward run
    inside one)."""
    return int(_resolved("_current_graph_task_id")())


# What hook_caller() returns for a hook run outside any autograd node (an engine's final callback).
OUTSIDE_NODE = object()


def hook_caller() -> Any:
    """Who runs the post-accumulate-grad hook running now: None for autograd's own grad
    accumulation (the param's ``AccumulateGrad`` node, a hook per param as its grad is made);
    else the node that runs it, the same for params handed over together (FSDP2 runs the hooks
    of a group's params in its post-backward, after their reduce-scatter), or
    :data:`OUTSIDE_NODE` (a final callback: FSDP2's root runs the groups left there)."""
    node = _resolved("_current_autograd_node")()
    if node is None:
        return OUTSIDE_NODE
    return None if isinstance(node, _resolved("AccumulateGrad")) else node


@functools.cache
def _resolved(name: str) -> Any:
    """:func:`resolve`, once per name (for calls on a hot path: a hook per param)."""
    return resolve(name)


def queue_callback(fn: Callable[[], None]) -> None:
    """Runs ``fn`` when the running backward ends (the autograd engine's final callbacks). Written
    as the attribute path itself: compiled autograd's trace recognizes that call."""
    torch.autograd.Variable._execution_engine.queue_callback(fn)


def in_compiled_autograd() -> bool:
    """Whether compiled autograd's graph is running now (False while Dynamo was never imported)."""
    if "torch._dynamo.compiled_autograd" not in sys.modules:
        return False
    return bool(resolve("in_compiled_autograd_region"))


@constant_under_dynamo
def backward_traced() -> bool:
    """Whether Dynamo traces ``backward()`` into the graph (``trace_autograd_ops``): a step
    compiled with it may read grads that the same graph computes."""
    try:
        return bool(resolve("trace_autograd_ops"))
    except (ImportError, AttributeError):  # (a torch without the option traces no backward)
        return False


def mark_static_address(t: Any) -> Any:
    """Marks tensor ``t`` as living at one address while it exists, as
    ``torch._dynamo.mark_static_address`` does (its attribute, without importing Dynamo)."""
    if isinstance(t, torch.Tensor) and getattr(t, "_dynamo_static_input_type", None) is None:
        setattr(t, "_dynamo_static_input_type", "unguarded")  # noqa: B010  (an attribute torch does not declare)
    return t


# ---- torch.optim, foreach ops, collectives ------------------------------------------------------


# (Resolved at import: torch's own import loads their modules, and a traced step reads them,
# where Dynamo cannot trace an import.)
_GLOBAL_STEP_HOOKS = (resolve("_global_optimizer_pre_hooks"), resolve("_global_optimizer_post_hooks"))
_FOREACH = {name: resolve(f"_foreach_{name}") for name in ("add", "sub", "mul", "div", "sqrt", "pow", "copy_", "norm")}


def global_step_hooks() -> tuple[dict[Any, Any], dict[Any, Any]]:
    """The step hooks registered for every optimizer (pre, post): torch's own dicts."""
    return _GLOBAL_STEP_HOOKS


def foreach(name: str) -> Callable[..., Any]:
    """``torch._foreach_<name>``."""
    return _FOREACH[name]


def functional_collectives() -> Any:
    """``torch.distributed._functional_collectives`` (an import statement, not :func:`resolve`: a
    traced sharded step calls this, and Dynamo traces an import statement but not importlib)."""
    import torch.distributed._functional_collectives as funcol

    return funcol


def strided_shard() -> type:
    """``_StridedShard`` (an import statement, as :func:`functional_collectives`)."""
    from torch.distributed.tensor.placement_types import _StridedShard

    return _StridedShard


# ---- the dispatcher --------------------------------------------------------------------------

OpOverload = torch._ops.OpOverload

PYTHON_KEY = torch._C.DispatchKey.Python
# The check kernels' dispatch key: one no tensor has (csrc/ops.cpp)
CHECK_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.PrivateUse3)
dispatch_keys: Callable[[torch.Tensor], Any] = torch._C._dispatch_keys


def has_kernel_for(op_name: str, key: str) -> bool:
    """Whether op ``op_name`` has a kernel for dispatch key ``key`` (a CUDA build's)."""
    return bool(torch._C._dispatch_has_kernel_for_dispatch_key(op_name, key))


def disable_current_modes() -> Any:
    """A context outside every active torch dispatch mode (a trace's fake mode)."""
    return resolve("_disable_current_modes")()


# ---- Inductor (imported on first use: the lowering runs inside a compile) -------------------


@functools.cache
def inductor(name: str) -> Any:
    """The Inductor module or class :data:`SYMBOLS` names ``inductor.<name>``."""
    return resolve(f"inductor.{name}")


def inductor_ir() -> Any:
    return inductor("ir")


def inductor_lowering() -> Any:
    return inductor("lowering")


def inductor_virtualized() -> Any:
    return inductor("virtualized")


def inductor_config() -> Any:
    return inductor("config")


def custom_graph_pass() -> type:
    return inductor("custom_graph_pass")


def backend_feature() -> Any:
    return inductor("BackendFeature")
