"""mooncake - compatibility package: Mooncake's Python transfer-engine API on ferry.

Inference servers (SGLang, vLLM) do ``from mooncake.engine import
TransferEngine``; this package provides that class (see ``mooncake.engine``)
implemented over ferry's own binding, so their code runs unchanged. Only the
transfer engine is provided, not Mooncake's store.
"""

__all__ = ["engine"]
