"""ferry._runtime - the shared libraries a built ferry (wheel or install)
needs at run time, and the message of an import that failed for want of one.

The extension links the libraries every engine needs by soname (the wheel
bundles none of them), so a host without one cannot load ``ferry._ferry``
at all: the loader's "libX.so.N: cannot open shared object file" becomes an
ImportError that names the Debian package to install and the feature the
library serves. The libraries of one feature each are loaded when that
feature is first used (libferry's src/base/library.h): without one, ferry
imports and everything else works, and using the feature fails (or, for
the fabric transport, falls back) with the same kind of message.
README.md's "Runtime libraries" table lists both (a test compares it with
the wheel's binaries).
"""

import re

# Linked: soname -> (Debian 12 package, what ferry uses it for)
RUNTIME_LIBRARIES = {
    "libcrypto.so.3": ("libssl3", "the shared-secret handshake and frame sealing"),
    "libjansson.so.4": ("libjansson4", "segment descriptors of every metadata store"),
    "libmicrohttpd.so.12": ("libmicrohttpd12", "the ferry tool's metadata-server (tool only)"),
}

# Loaded when their feature is first used: soname -> (package, feature)
FEATURE_LIBRARIES = {
    "libcurl.so.4": ("libcurl4", "the http and etcd metadata stores"),
    "libhiredis.so.0.14": ("libhiredis0.14", "the redis metadata store"),
    "libfabric.so.1": ("libfabric1", "the fabric transport (protocol rdma, efa)"),
}

_MISSING = re.compile(r"(\S+\.so[.\d]*): cannot open shared object file")


def missing_library_error(err):
    """An ImportError naming the library, its package and its feature, for a
    load of ferry._ferry that failed because a library is missing; ``err``
    itself for any other failure."""
    found = _MISSING.search(str(err))
    if not found:
        return err
    soname = found.group(1)
    stem = soname.split(".so")[0]  # another version of a listed library is the same feature
    package, feature = next((entry for name, entry in RUNTIME_LIBRARIES.items()
                             if name.split(".so")[0] == stem), (None, "an unknown feature"))
    install = ("apt-get install %s" % package if package else
               "install the package that provides %s" % soname)
    return ImportError(
        "ferry cannot load its C extension: %s is missing on this host (used for %s; "
        "ferry links it, so nothing runs without it). Fix: %s, or build the wheel on a host "
        "like this one. README.md, 'Runtime libraries', lists each library ferry needs."
        % (soname, feature, install), name=err.name, path=err.path)
