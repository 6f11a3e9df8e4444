"""test_switching_doc.py - the log lines docs/switching-from-mooncake.md tells
an operator to look for ("Confirm that ferry is the engine in use") are the
ones the drop-in prints: the page quotes them, the engine logs them."""

import logging
import os
import re

from mooncake.engine import TransferEngine

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def confirm_section():
    text = open(os.path.join(ROOT, "docs", "switching-from-mooncake.md"), encoding="utf-8").read()
    return text.split("## 5. Confirm that ferry is the engine in use", 1)[1].split("\n## ", 1)[0]


def quoted_as_pattern(quote):
    """The page's example line as a regex: its address, port and version vary."""
    pattern = re.escape(quote)
    pattern = re.sub(r"10\\\.0\\\.0\\\.\d:\d+", r"[^ ]+", pattern)
    return re.sub(r"0\\\.1\\\.0", r"[0-9.]+", pattern)


def initialize_and_log(caplog, protocol, monkeypatch, **env):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    caplog.set_level(logging.INFO, logger="mooncake.engine")
    te = TransferEngine()
    try:
        assert te.initialize("127.0.0.1", "P2PHANDSHAKE", protocol, "") == 0, te.last_error()
        return [r.getMessage() for r in caplog.records if r.name == "mooncake.engine"]
    finally:
        te.close()


def test_ready_line_is_the_one_the_page_quotes(caplog, monkeypatch):
    quote = re.search(r"```\n(transfer engine ready: [^\n]*)\n```", confirm_section()).group(1)
    lines = initialize_and_log(caplog, "tcp", monkeypatch)
    assert any(re.fullmatch(quoted_as_pattern(quote), line) for line in lines), (quote, lines)


def test_fabric_line_is_the_one_the_page_quotes(caplog, monkeypatch):
    quote = re.search(r"`(protocol 'rdma': ferry's fabric transport \(provider\s+verbs;ofi_rxm\))`",
                      confirm_section()).group(1)
    quote = re.sub(r"\s+", " ", quote).replace("verbs;ofi_rxm", "tcp;ofi_rxm")
    lines = initialize_and_log(caplog, "rdma", monkeypatch, FERRY_FABRIC_PROVIDER="tcp;ofi_rxm",
                               FERRY_TRANSPORTS="fabric,tcp")
    assert quote in lines, (quote, lines)
