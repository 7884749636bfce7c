"""What is measured: step, compile and training-step benchmarks (run from the repository root,
``python -m benchmarks.<script>``), their shared helpers (``benchmarks.common``) and the studies
behind the evidence pages (``benchmarks.studies``). Today's numbers: ``benchmarks/RESULTS.md``."""
