"""Inductor code generation for a described NVIDIA GPU on a machine without one.

``torch.compile`` can generate the Triton code of a CUDA graph, and Triton can compile it
to PTX and a cubin with its bundled ``ptxas``, with no GPU present, once torch and Triton
are told what GPU to generate for. :func:`described_gpu` tells them; :func:`generate`
compiles a function on fake CUDA tensors and returns what Inductor generated. Nothing
runs on a GPU: the result is the code a GPU would run, its kernels and launches, and the
bytes each kernel moves by Inductor's own count.

Every shim here patches private torch / Triton internals, so this module is pinned to the
torch releases it was written against (:data:`TESTED_TORCH`) and refuses others with a
clear error. It patches process-wide state: use it in a process of its own (the
benchmark script, or a test's subprocess), never inside a process that also uses CUDA.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import re
import time
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import torch

# (torch major.minor, Triton major.minor) pairs this module's shims were checked against.
TESTED_TORCH = {("2.14", "3.8"), ("2.15", "3.9")}


@dataclasses.dataclass(frozen=True)
class Gpu:
    """The properties of a GPU that Inductor and Triton read (``cudaDeviceProp`` names),
    plus its DRAM bandwidth for the launch/bytes model."""

    key: str
    name: str
    major: int
    minor: int
    multi_processor_count: int
    total_memory: int
    L2_cache_size: int
    shared_memory_per_block_optin: int
    bandwidth_gbs: float  # peak DRAM bandwidth (vendor figure)
    warp_size: int = 32
    max_threads_per_multi_processor: int = 2048
    max_threads_per_block: int = 1024
    regs_per_multiprocessor: int = 65536
    shared_memory_per_block: int = 48 * 1024
    shared_memory_per_multiprocessor: int = 0
    is_integrated: int = 0
    is_multi_gpu_board: int = 0
    uuid: str = "00000000-0000-0000-0000-000000000000"
    pci_bus_id: int = 0
    pci_device_id: int = 0
    pci_domain_id: int = 0
    gcnArchName: str = "NVIDIA"  # noqa: N815  (torch's spelling)

    @property
    def cc(self) -> int:
        return self.major * 10 + self.minor


# Values of cudaGetDeviceProperties on each part (SXM boards); bandwidths are NVIDIA's data sheets.
GPUS = {
    "h100": Gpu("h100", "NVIDIA H100 80GB HBM3", 9, 0, multi_processor_count=132, total_memory=85_029_158_912,
                L2_cache_size=52_428_800, shared_memory_per_block_optin=232_448,
                shared_memory_per_multiprocessor=233_472, bandwidth_gbs=3350.0),
    "a100": Gpu("a100", "NVIDIA A100-SXM4-80GB", 8, 0, multi_processor_count=108, total_memory=85_097_971_712,
                L2_cache_size=41_943_040, shared_memory_per_block_optin=166_912,
                shared_memory_per_multiprocessor=167_936, bandwidth_gbs=2039.0),
    "b200": Gpu("b200", "NVIDIA B200", 10, 0, multi_processor_count=148, total_memory=191_476_809_728,
                L2_cache_size=132_644_864, shared_memory_per_block_optin=232_448,
                shared_memory_per_multiprocessor=233_472, bandwidth_gbs=8000.0),
}


def check_versions() -> None:
    """Refuses a torch / Triton pair whose internals the shims were not written for."""
    try:
        import triton
    except ImportError as e:
        raise RuntimeError("code generation for a described GPU needs Triton (a CUDA build of torch)") from e
    have = (".".join(torch.__version__.split(".")[:2]), ".".join(triton.__version__.split(".")[:2]))
    if have not in TESTED_TORCH:
        raise RuntimeError(f"described_gpu patches private torch/Triton internals and was checked with "
                           f"torch/Triton {sorted(TESTED_TORCH)}; this is torch {torch.__version__} with Triton "
                           f"{triton.__version__}. Check the shims in {__file__} against this release first.")
    if torch.version.cuda is None:
        raise RuntimeError(f"torch {torch.__version__} is a CPU build: code generation for CUDA needs a CUDA build")


@dataclasses.dataclass
class CompiledKernel:
    """One Triton kernel Inductor generated, as Triton compiled it."""

    configs: int  # autotuning configs compiled
    cubins: int  # of those, the ones that produced a cubin
    num_gb: float | None  # Inductor's count of the bytes one launch moves (GB)
    arch: str


def _cubin(kernel: Any) -> bytes | None:
    """A compiled kernel's cubin (Triton's kernel, or Inductor's statically launched wrapper)."""
    asm = getattr(kernel, "asm", None)
    return asm.get("cubin") if asm is not None else getattr(kernel, "cubin_raw", None)


# kernel name -> what Triton made of it, for the kernels compiled under described_gpu()
COMPILED: dict[str, CompiledKernel] = {}


@contextlib.contextmanager
def described_gpu(gpu: Gpu, configs: int = 0) -> Iterator[Gpu]:
    """torch, Dynamo, Inductor and Triton see ``gpu`` as CUDA device 0 for the duration;
    Triton compiles its kernels (PTX, cubin) but makes no launchers. Process-wide.
    ``configs``: compile only the first this many autotuning configs of each kernel (0: all;
    a GPU autotunes among all of them at the first call)."""
    check_versions()
    import triton
    from torch._dynamo import device_interface
    from torch._inductor.runtime import triton_heuristics
    from triton.backends import Backend, backends
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.driver import CudaDriver

    props = SimpleNamespace(**dataclasses.asdict(gpu))
    target = GPUTarget("cuda", gpu.cc, gpu.warp_size)

    class DescribedDriver(CudaDriver):
        """A Triton driver for a GPU that is not there: a target to compile for, no launches."""

        def __init__(self) -> None:  # (CudaDriver's loads libcuda)
            pass

        @staticmethod
        def is_active() -> bool:
            return True

        def get_current_target(self) -> GPUTarget:
            return target

        def get_current_device(self) -> int:
            return 0

        def get_device_capability(self, device: int = 0) -> tuple[int, int]:
            return (gpu.major, gpu.minor)

    def precompile(self: Any, *args: Any, **kwargs: Any) -> None:
        if configs and self.configs:
            self.configs = self.configs[:configs]
        self._precompile_worker()  # compile each config to a cubin; no launcher (it would load it)
        meta = self.inductor_meta
        cubins = [bool(_cubin(r.kernel)) for r in self.compile_results]
        COMPILED[meta.get("kernel_name", "?")] = CompiledKernel(
            configs=len(cubins), cubins=sum(cubins), num_gb=meta.get("kernel_num_gb"),
            arch=f"sm_{target.arch}")

    from torch._inductor.fx_passes import joint_graph

    folder = joint_graph.UniformValueConstantFolder
    deduce_on_gpu = folder._deduce_value

    def deduce_on_cpu(self: Any, node: torch.fx.Node) -> Any:
        with _OnCpu():  # (Inductor folds uniform constants by running them on their device)
            return deduce_on_gpu(self, node)

    cuda_patches = {
        "get_device_properties": lambda device=None: props,
        "get_device_capability": lambda device=None: (gpu.major, gpu.minor),
        "get_device_name": lambda device=None: gpu.name,
        "device_count": lambda: 1,
        "current_device": lambda: 0,
        "set_device": lambda device: None,
        "is_bf16_supported": lambda including_emulation=True: True,
        "_lazy_init": lambda: None,
    }
    saved_cuda = {k: getattr(torch.cuda, k) for k in cuda_patches}
    interface = device_interface.CudaInterface  # (binds torch.cuda's functions at import)
    interface_patches = {k: staticmethod(fn) for k, fn in cuda_patches.items() if k in vars(interface)}
    interface_patches["is_available"] = staticmethod(lambda: True)
    saved_interface = {k: vars(interface)[k] for k in interface_patches}
    saved_backend = backends["nvidia"]
    saved_active = triton.runtime.driver._active
    saved_precompile = triton_heuristics.CachingAutotuner.precompile
    try:
        folder._deduce_value = deduce_on_cpu
        for k, fn in cuda_patches.items():
            setattr(torch.cuda, k, fn)
        # Only Dynamo's device interface says CUDA is there: with torch.cuda.is_available()
        # True, Dynamo would read the (absent) CUDA RNG state.
        for k, fn in interface_patches.items():
            setattr(interface, k, fn)
        device_interface.caching_worker_device_properties.pop("cuda", None)
        backends["nvidia"] = Backend(compiler=saved_backend.compiler, driver=DescribedDriver)
        triton.runtime.driver.set_active(DescribedDriver())
        triton_heuristics.CachingAutotuner.precompile = precompile
        _clear_device_caches()
        yield gpu
    finally:
        for k, fn in saved_cuda.items():
            setattr(torch.cuda, k, fn)
        for k, fn in saved_interface.items():
            setattr(interface, k, fn)
        device_interface.caching_worker_device_properties.pop("cuda", None)
        backends["nvidia"] = saved_backend
        triton.runtime.driver._active = saved_active
        triton_heuristics.CachingAutotuner.precompile = saved_precompile
        folder._deduce_value = deduce_on_gpu
        _clear_device_caches()


def _clear_device_caches() -> None:
    """Forgets what torch cached of the devices (whether Triton can run, device properties)."""
    import torch.utils._triton
    from torch._inductor.runtime.hints import DeviceProperties

    torch.utils._triton.has_triton.cache_clear()
    DeviceProperties.create.cache_clear()


class _OnCpu(torch.utils._python_dispatch.TorchDispatchMode):
    """Runs every op on CPU: CUDA devices in arguments become the CPU."""

    @staticmethod
    def _cpu(x: Any) -> Any:
        if isinstance(x, torch.device) and x.type == "cuda":
            return torch.device("cpu")
        if isinstance(x, str) and x.startswith("cuda"):
            return "cpu"
        return x

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        args = tuple(self._cpu(a) for a in args)
        kwargs = {k: self._cpu(v) for k, v in (kwargs or {}).items()}
        return func(*args, **kwargs)


@dataclasses.dataclass
class Generated:
    """What Inductor generated for one compiled call on the described GPU."""

    code: str  # the generated Python module(s): wrapper and Triton kernel sources
    kernels: int  # distinct Triton kernels defined
    launches: int  # Triton kernel launches in one call of the compiled function
    extern_calls: int  # calls of external kernels (our ops, cuBLAS matmuls, ...) per call
    lamb_calls: dict[str, int]  # of those, calls per torch.ops.lamb op
    gb_per_call: float  # bytes all launches move per call by Inductor's count (GB)
    kernel_gb: dict[str, float]  # kernel name -> GB one launch moves
    cubins_missing: list[str]  # kernels with a config that produced no cubin
    compile_s: float


_KERNEL_SOURCE = re.compile(r"async_compile\.triton\('\w+', '''.*?'''", re.S)
_LAUNCH = re.compile(r"^\s*(\w+)\.run\(", re.M)
_EXTERN = re.compile(r"^\s*(?:\w+ = )?(?:extern_kernels\.\w+|torch\.ops\.\w+\.\w+(?:\.\w+)?)\(", re.M)


def summarize(code: str, compile_s: float = 0.0) -> Generated:
    """Counts the kernels, launches and external calls of generated ``code`` and the
    bytes its launches move, from the kernels :data:`COMPILED` recorded."""
    names = set(re.findall(r"^(\w+) = async_compile\.triton\('(\w+)'", code, re.M))
    wrapper = _KERNEL_SOURCE.sub("", code)  # (a kernel's source holds benchmark code with launches)
    launches = _LAUNCH.findall(wrapper)
    externs = _EXTERN.findall(wrapper)
    defined = {var: name for var, name in names}
    kernel_gb = {var: (COMPILED[name].num_gb or 0.0) for var, name in defined.items() if name in COMPILED}
    missing = [name for name in defined.values()
               if name not in COMPILED or COMPILED[name].cubins < COMPILED[name].configs or not COMPILED[name].cubins]
    lamb_calls: dict[str, int] = {}
    for op in re.findall(r"torch\.ops\.lamb\.(\w+)", "\n".join(externs)):
        lamb_calls[op] = lamb_calls.get(op, 0) + 1
    return Generated(code=code, kernels=len(defined), launches=len(launches), extern_calls=len(externs),
                     lamb_calls=lamb_calls,
                     gb_per_call=sum(kernel_gb.get(k, 0.0) for k in launches), kernel_gb=kernel_gb,
                     cubins_missing=sorted(missing), compile_s=compile_s)


@contextlib.contextmanager
def cudagraph_blockers() -> Iterator[list[str]]:
    """Collects, for every graph Inductor compiles meanwhile, why CUDA graphs would skip it for
    the inputs it writes ("mutated inputs": written inputs that are not static addresses),
    decided by Inductor's own check (``check_for_mutation_ignore_cuda_graph_managed_tensor``,
    cudagraph trees) on the graph and the static inputs it was compiled with. An empty list:
    nothing a graph writes stops ``mode="reduce-overhead"``. What a GPU decides at run time
    besides (a new tensor address re-records) is not seen here."""
    from torch._inductor import output_code
    from torch._inductor.cudagraph_utils import check_for_mutation_ignore_cuda_graph_managed_tensor

    reasons: list[str] = []
    real = output_code.CompiledFxGraph.__init__
    names = list(inspect.signature(real).parameters)[1:]

    def init(graph_self: Any, *args: Any, **kwargs: Any) -> None:
        real(graph_self, *args, **kwargs)
        bound = dict(zip(names, args), **kwargs)
        from torch._inductor import config

        with config.patch({"triton.cudagraph_trees": True}):
            reason = check_for_mutation_ignore_cuda_graph_managed_tensor(
                bound["gm"], graph_self.mutated_inputs, graph_self.mutated_input_idxs, bound["static_input_idxs"])
        if reason is not None:
            reasons.append(reason.splitlines()[0])

    output_code.CompiledFxGraph.__init__ = init
    try:
        yield reasons
    finally:
        output_code.CompiledFxGraph.__init__ = real


def _compiled(compile: Callable[[], Any]) -> Generated:
    """Runs ``compile()`` (which compiles with Inductor) and returns what it generated."""
    from torch._inductor import config
    from torch._inductor.utils import run_and_get_code

    start = time.perf_counter()
    with config.patch(benchmark_kernel=True):  # (benchmark_kernel: the bytes of each kernel in its metadata)
        _, codes = run_and_get_code(compile)
    return summarize("\n".join(codes), time.perf_counter() - start)


def generate(fn: Callable[..., Any], *args: Any, fullgraph: bool = False, **kwargs: Any) -> Generated:
    """Compiles ``fn(*args, **kwargs)`` with Inductor (call it under :func:`described_gpu`,
    inside the ``FakeTensorMode`` that made its CUDA tensors) and returns what was generated.
    The compiled code does not run: the call runs ``fn``'s graph on the fake tensors."""
    from torch._inductor.compile_fx import compile_fx

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        compile_fx(gm, example_inputs)  # generates and compiles; its result would launch kernels
        return gm.forward

    torch._dynamo.reset()
    return _compiled(lambda: torch.compile(fn, backend=backend, fullgraph=fullgraph)(*args, **kwargs))


def compile_graph(gm: torch.fx.GraphModule, inputs: list[Any]) -> Generated:
    """Compiles an aten-level graph (AOTAutograd's output, no autograd left in it) for the
    described GPU with Inductor: ``inputs`` are fake CUDA tensors like its placeholders."""
    from torch._inductor.compile_fx import compile_fx

    return _compiled(lambda: compile_fx(gm, inputs))


def on_cuda(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """``gm`` with every CPU device argument made CUDA device 0 (in place)."""
    cuda = torch.device("cuda", 0)
    for node in gm.graph.nodes:
        for k, v in node.kwargs.items():
            if isinstance(v, torch.device) and v.type == "cpu":
                node.update_kwarg(k, cuda)
        node.args = tuple(cuda if isinstance(a, torch.device) and a.type == "cpu" else a for a in node.args)
    gm.recompile()
    return gm


def like_on_cuda(x: Any) -> Any:
    """A CUDA tensor like CPU tensor ``x`` (shape, strides, dtype); anything else as it is."""
    if not isinstance(x, torch.Tensor):
        return x
    return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="cuda")


def combine(parts: list[Generated]) -> Generated:
    """The counts of several graphs that one call runs (a step with graph breaks)."""
    calls: dict[str, int] = {}
    for p in parts:
        for op, k in p.lamb_calls.items():
            calls[op] = calls.get(op, 0) + k
    return Generated(code="\n".join(p.code for p in parts), kernels=sum(p.kernels for p in parts),
                     launches=sum(p.launches for p in parts), extern_calls=sum(p.extern_calls for p in parts),
                     lamb_calls=calls, gb_per_call=sum(p.gb_per_call for p in parts),
                     kernel_gb={k: v for p in parts for k, v in p.kernel_gb.items()},
                     cubins_missing=sorted({k for p in parts for k in p.cubins_missing}),
                     compile_s=sum(p.compile_s for p in parts))


def fake_mode() -> Any:
    """The fake tensor mode to make the CUDA tensors in (and run one eager step in, so that
    optimizer state exists before compiling). Constants are kept as fake tensors."""
    import torch.fx.experimental.proxy_tensor as proxy_tensor
    from torch._subclasses.fake_tensor import FakeTensorMode

    proxy_tensor.CONSTANT_NUMEL_LIMIT = 0  # (a real constant would need a real CUDA tensor)
    return FakeTensorMode()


def run_interpreted(fn: Callable[..., Any], **tensors: Any) -> None:
    """Compiles ``fn(**tensors)`` for the described GPU (fake CUDA copies of ``tensors``: lists
    of tensors and tensors) and runs the generated code on ``tensors`` themselves, CPU tensors,
    with every Triton kernel executed by Triton's interpreter. Needs ``TRITON_INTERPRET=1`` in
    the environment before Triton is imported, and :func:`described_gpu` around the call.

    What the generated wrapper needs of a GPU is given it on the CPU: its buffers are CPU
    tensors, its stream 0, its device guard a no-op. Triton's interpreter runs no libdevice
    function (they are external calls); Inductor's ``libdevice.pow`` (the float64 bias
    corrections ``beta ** t``) runs as ``exp(t * log(beta))`` instead."""
    import triton.language as tl
    from torch._inductor.compile_fx import compile_fx
    from torch._inductor.runtime import triton_helpers, triton_heuristics

    class NoGuard:
        def __init__(self, index: int) -> None:
            pass

        def __enter__(self) -> NoGuard:
            return self

        def __exit__(self, *exc: Any) -> bool:
            return False

    compiled: dict[str, Any] = {}

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        compiled["gm"], compiled["fn"] = gm, compile_fx(gm, example_inputs)
        return gm.forward

    def fake_like(x: Any) -> Any:
        if isinstance(x, list):
            return [fake_like(t) for t in x]
        return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="cuda")

    patches = [(triton_heuristics.CachingAutotuner, "precompile", lambda self, *a, **k: None),
               (torch._C._dynamo.guards, "_empty_strided_cuda",
                lambda size, stride, dtype: torch.empty_strided(size, stride, dtype=dtype)),
               (torch._C, "_cuda_getCurrentRawStream", lambda device: 0), (torch.cuda, "_DeviceGuard", NoGuard),
               (triton_helpers.libdevice, "pow", lambda a, b: tl.exp(tl.log(a) * b))]
    saved = [(obj, name, getattr(obj, name)) for obj, name, _ in patches]
    try:
        for obj, name, value in patches:
            setattr(obj, name, value)
        torch._dynamo.reset()
        with fake_mode():
            torch.compile(fn, backend=backend, fullgraph=True)(**{k: fake_like(v) for k, v in tensors.items()})
        # Dynamo names the graph input of tensors[k][i] l_{k}_{i}_ (l_kw_{k}_{i}_ through **kw)
        by_name = {f"{k}_{i}_": t for k, v in tensors.items() if isinstance(v, list) for i, t in enumerate(v)}
        by_name.update({f"{k}_": v for k, v in tensors.items() if not isinstance(v, list)})
        inputs = [n.name.removeprefix("l_").removeprefix("kw_") for n in compiled["gm"].graph.nodes
                  if n.op == "placeholder"]
        compiled["fn"](*[by_name[name] for name in inputs])
    finally:
        for obj, name, value in saved:
            setattr(obj, name, value)
