"""The tensors an optimizer was given, in order, with their names: what an engine's flat
partitions (DeepSpeed ZeRO, ``_deepspeed``) are mapped back to."""

from __future__ import annotations

from typing import Any

from torch import Tensor

__all__ = ["ModelTensors"]


class ModelTensors:
    """The tensors an optimizer was given, in order (the same on every rank), with their names:
    what an engine's flat partitions are mapped back to. Owned by the optimizer
    (``opt._model``); a copy of the optimizer carries it (the index by id is rebuilt), not its
    cache of partition maps."""

    def __init__(self) -> None:
        self.params: list[Tensor] = []
        self.names: list[str | None] = []
        self.index: dict[int, int] = {}  # id(param) -> its position
        self.partition_maps: dict[int, Any] = {}  # id(flat partition) -> where its pieces lie (_deepspeed)

    def add(self, params: list[Tensor], names: list[str | None] | None) -> None:
        for p, name in zip(params, names or [None] * len(params)):
            self.index[id(p)] = len(self.params)
            self.params.append(p)
            self.names.append(name)

    def reindex(self) -> None:
        self.index = {id(p): i for i, p in enumerate(self.params)}
        self.partition_maps = {}

    def __getstate__(self) -> dict[str, Any]:
        return {"params": self.params, "names": self.names}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.params, self.names = state["params"], state["names"]
        self.reindex()
