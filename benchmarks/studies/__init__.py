"""The studies behind the evidence pages (large batches, LAMB16's accuracy, bfloat16 params,
convergence, DeepSpeed ZeRO): long runs that write a JSON and a plot beside themselves;
``python -m benchmarks.studies.<script>`` from the repository root."""
