"""Training examples, each a script to read and run (``python examples/train_mnist.py``); the
benchmarks import their models and data from here."""
