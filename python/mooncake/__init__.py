"""mooncake - compatibility package: Mooncake's Python transfer-engine API on ferry.

Inference servers (SGLang, vLLM) do ``from mooncake.engine import
TransferEngine``; this package provides that class (see ``mooncake.engine``)
implemented over ferry's own binding, so their code runs unchanged; and
``from mooncake.store import MooncakeDistributedStore``, Mooncake's store
client, on ferry's store (``mooncake.store``, docs/store.md).
"""

__all__ = ["engine", "store"]
