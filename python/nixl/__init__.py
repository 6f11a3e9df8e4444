"""nixl - NIXL's Python API (ai-dynamo/nixl) implemented on ferry.

vLLM's NixlConnector and NIXL's examples call ``nixl._api.nixl_agent``; this
package gives them that API over one ferry engine per agent, so they run
unchanged with ferry installed in place of NIXL's wheel:

    from nixl import nixl_agent, nixl_agent_config

Modules: ``nixl._api`` (agents), ``nixl._bindings`` (descriptor lists,
memory-type constants, errors, ``nixlXferTelemetry``), ``nixl._utils`` and
``nixl.logging``. README.md ("NIXL API") shows the connector's call shape.
"""

from nixl._api import nixl_agent, nixl_agent_config, nixl_thread_sync_t  # noqa: F401

__all__ = ["nixl_agent", "nixl_agent_config", "nixl_thread_sync_t"]
