"""Inductor lowerings of the torch.ops.lamb ops (the Inductor-lowering issue); empty until they land."""
