"""mooncake.http_metadata_server - the metadata service Mooncake's wheel
ships, as SGLang's and vLLM's deployment docs start it:

    python -m mooncake.http_metadata_server [--host H] [--port 8080]
    mooncake_http_metadata_server [--host H] [--port 8080]

served by ferry's own metadata server (`ferry metadata-server`), with the
same path and answers: GET/PUT/DELETE /metadata?key=K; 400 for a missing or
blank key, 404 for an unknown one.

Unlike Mooncake's, it listens on 127.0.0.1 unless --host says otherwise: the
store has no authentication, so serving other hosts is an explicit choice
(--host 0.0.0.0, or this host's address on the cluster network).
"""

import argparse
import sys

from ferry import __main__ as ferry_tool


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="mooncake_http_metadata_server",
        description="HTTP metadata service for Mooncake's TransferEngine (served by ferry).")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (default 127.0.0.1; 0.0.0.0 for every "
                             "interface: the store has no authentication)")
    parser.add_argument("--port", type=int, default=8080,
                        help="port to listen on, 0 picks a free one (default 8080)")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    return ferry_tool.run(["metadata-server", "--host", args.host, "--port", str(args.port)])


if __name__ == "__main__":
    sys.exit(main())
