"""Integrations with training frameworks that pick optimizers by name. Each module imports its
framework when it is imported (never by ``import inductor_lamb``): ``torchtitan`` (TorchTitan's
``OptimizersContainer``), ``timm`` (timm's optimizer registry)."""
