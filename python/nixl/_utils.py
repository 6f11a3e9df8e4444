"""nixl._utils - helpers of nixl._api: tensors as descriptors (any object
with torch's data_ptr / numel / element_size / device / is_contiguous, so
torch is not imported here), the check of descriptors against registered
regions, and what agents exchange as bytes, each a tag line and JSON: the
metadata an agent publishes and serialized descriptor lists (NIXL pickles
those; a peer's bytes are never unpickled here).
"""

import ctypes
import json

import numpy as np

from nixl._bindings import MEM_TYPE_NAMES, nixlInvalidParamError, nixlRegDList, nixlXferDList

METADATA_TAG = b"ferry-nixl-metadata/1\n"
DLIST_TAG = b"ferry-nixl-dlist/1\n"


def is_tensor(obj):
    return hasattr(obj, "data_ptr") and hasattr(obj, "element_size") and hasattr(obj, "device")


def tensor_desc(t, where):
    """(addr, nbytes, dev_id, memory name) of a contiguous tensor."""
    if not t.is_contiguous():
        raise nixlInvalidParamError(f"{where}: the tensor is not contiguous (shape "
                                    f"{tuple(t.shape)}, strides {t.stride()}): pass "
                                    f".contiguous() or its storage")
    device = str(t.device)
    dev_id = t.get_device() if device.startswith("cuda") else 0
    mem = "VRAM" if device.startswith("cuda") else "DRAM"
    return (t.data_ptr(), t.numel() * t.element_size(), max(dev_id, 0)), mem


class Regions:
    """Registered ranges, sorted by address, for checking descriptors."""

    def __init__(self, rows):
        rows = sorted((int(a), int(n)) for a, n in rows)
        self.starts = np.array([a for a, _ in rows], dtype=np.uint64)
        self.ends = np.array([a + n for a, n in rows], dtype=np.uint64)

    def first_outside(self, descs):
        """Index of the first (addr, len, dev) row not inside one region, or -1."""
        if len(descs) == 0:
            return -1
        addr, length = descs[:, 0], descs[:, 1]
        at = np.searchsorted(self.starts, addr, side="right").astype(np.int64) - 1
        inside = (at >= 0) & (length > 0)
        inside[inside] &= addr[inside] + length[inside] <= self.ends[at[inside]]
        bad = np.flatnonzero(~inside)
        return int(bad[0]) if bad.size else -1


def encode_metadata(agent, engine, regions):
    """regions: [(addr, len, dev_id, memory name)]; engine None: partial
    metadata without connection info."""
    body = {"agent": agent, "engine": engine, "regions": [list(r) for r in regions]}
    return METADATA_TAG + json.dumps(body, separators=(",", ":")).encode()


def decode_metadata(data):
    """(agent, engine or None, [(addr, len, dev_id, memory name)])."""
    if isinstance(data, str):
        data = data.encode()
    if not isinstance(data, (bytes, bytearray, memoryview)) or \
            not bytes(data[:len(METADATA_TAG)]) == METADATA_TAG:
        raise nixlInvalidParamError("add_remote_agent: not an agent's metadata from ferry's nixl "
                                    "(get_agent_metadata); NIXL's own metadata cannot be mixed "
                                    "with ferry's")
    try:
        body = json.loads(bytes(data[len(METADATA_TAG):]))
        agent, engine = body["agent"], body["engine"]
        regions = [(int(a), int(n), int(d), str(m)) for a, n, d, m in body["regions"]]
        if any(not 0 <= v < 1 << 64 for r in regions for v in r[:3]):
            raise ValueError("a region field outside 0 .. 2^64-1")
    except (ValueError, KeyError, TypeError) as e:
        raise nixlInvalidParamError(f"add_remote_agent: malformed metadata ({e})") from None
    if not isinstance(agent, str) or not agent or not (engine is None or isinstance(engine, str)):
        raise nixlInvalidParamError("add_remote_agent: malformed metadata (agent or engine)")
    return agent, engine, regions


def encode_dlist(dlist, what):
    """A descriptor list (nixlXferDList or nixlRegDList) as bytes."""
    if not isinstance(dlist, (nixlXferDList, nixlRegDList)):
        raise nixlInvalidParamError(f"{what}: needs a nixlXferDList or nixlRegDList, got "
                                    f"{type(dlist).__name__}")
    body = {"reg": isinstance(dlist, nixlRegDList), "mem": int(dlist.mem_type),
            "descs": dlist.descs.tolist(), "metas": list(dlist.metas)}
    return DLIST_TAG + json.dumps(body, separators=(",", ":")).encode()


def decode_dlist(data, what):
    """The descriptor list encode_dlist made; anything else is refused."""
    if not isinstance(data, (bytes, bytearray, memoryview)) or \
            bytes(data[:len(DLIST_TAG)]) != DLIST_TAG:
        raise nixlInvalidParamError(f"{what}: not a descriptor list from ferry's nixl "
                                    f"(get_serialized_descs)")
    try:
        body = json.loads(bytes(data[len(DLIST_TAG):]))
        mem, descs, metas = body["mem"], body["descs"], body["metas"]
        if mem not in MEM_TYPE_NAMES or len(metas) != len(descs):
            raise ValueError("memory type or descriptor count")
        if any(not isinstance(v, int) or not 0 <= v < 1 << 64 for d in descs for v in d):
            raise ValueError("a descriptor field outside 0 .. 2^64-1")
        if body["reg"]:
            return nixlRegDList(mem, [tuple(d) + (str(m),) for d, m in zip(descs, metas)])
        return nixlXferDList(mem, [tuple(d) for d in descs])
    except (ValueError, KeyError, TypeError) as e:
        raise nixlInvalidParamError(f"{what}: malformed descriptor list ({e})") from None


_libc = ctypes.CDLL(None)
_libc.malloc.restype = ctypes.c_void_p
_libc.malloc.argtypes = [ctypes.c_size_t]
_libc.free.argtypes = [ctypes.c_void_p]


def malloc_passthru(size):
    """NIXL's helper: size bytes of host memory from malloc, as an address
    (free it with free_passthru). MemoryError when malloc fails."""
    addr = _libc.malloc(int(size))
    if not addr:
        raise MemoryError(f"malloc_passthru: malloc({size}) failed")
    return addr


def free_passthru(addr):
    _libc.free(ctypes.c_void_p(addr))
