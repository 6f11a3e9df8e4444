"""python -m ferry COMMAND [ARGS] - the `ferry` command-line tool for
Python-only installs: `metadata-server`, `doctor`, `bench`, `serve`,
`probe`, `version` (`python -m ferry help` lists them). Also the `ferry`,
`mooncake_master` and `transfer_engine_bench` console commands that `pip
install .` creates.

It runs the tool built with this package (ferry/ferry-tool, the same program
CMake builds as build/ferry), replacing this process, so signals, output
and the exit code are the tool's own. FERRY_TOOL names another binary.
"""

import os
import sys

TOOL_NAME = "ferry-tool"


def tool_path():
    """The tool to run: $FERRY_TOOL, else the one built with this package."""
    override = os.environ.get("FERRY_TOOL")
    if override:
        return override
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), TOOL_NAME)


def run(args):
    """Replaces this process with `ferry ARGS...`; returns only on failure."""
    path = tool_path()
    # `ferry doctor` checks which mooncake.engine this Python would import.
    os.environ.setdefault("FERRY_PYTHON", sys.executable)
    try:
        os.execv(path, ["ferry"] + list(args))
    except OSError as e:
        sys.stderr.write("ferry: cannot run the ferry tool %s: %s (rebuild the package, or set "
                         "FERRY_TOOL to a ferry binary)\n" % (path, e.strerror))
    return 127


def main():
    return run(sys.argv[1:])


def mooncake_master():
    """The `mooncake_master` console command: the store's master (docs/store.md)."""
    return run(["store-master"] + sys.argv[1:])


def transfer_engine_bench():
    """The `transfer_engine_bench` console command: Mooncake's transfer engine
    benchmark, its flags (`--mode=target|initiator`, README "Command line")."""
    return run(["transfer-engine-bench"] + sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
