"""Developer tools for the CUDA side: Triton code generated for a described GPU
(``tools.cuda_codegen``, ``tools.described_gpu``), the CUDA kernels' machine code
(``tools.cuda_sass``) and the GPU machine check (``tools/gpu_check.sh``). Run from the
repository root: ``python -m tools.<script>``."""
