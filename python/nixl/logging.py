"""nixl.logging - the package's loggers: get_logger(name) returns the
standard logging logger "nixl" or "nixl.<name>", so the host's logging
configuration decides where the lines go (ferry's own lines stay on the
logger "ferry")."""

import logging as _std


def get_logger(name=None):
    """The logger "nixl" (name None or "nixl") or "nixl.<name>"."""
    if not name or name == "nixl":
        return _std.getLogger("nixl")
    return _std.getLogger(name if name.startswith("nixl.") else "nixl." + name)
