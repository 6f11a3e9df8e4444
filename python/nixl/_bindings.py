"""nixl._bindings - the layer under nixl._api, as NIXL's callers import it.

In NIXL this is a compiled module; here it is plain Python over numpy:
descriptor lists (``nixlRegDList``, ``nixlXferDList``: an N x 3 uint64 array
of (addr, len, dev_id) and, for registration, one metadata string each), the
memory-type constants, the error classes NIXL raises and
``nixlXferTelemetry``. The transfers themselves are ferry's (nixl._api).
"""

import numpy as np

DRAM_SEG = 0
VRAM_SEG = 1
BLK_SEG = 2
OBJ_SEG = 3
FILE_SEG = 4

MEM_TYPE_NAMES = {DRAM_SEG: "DRAM", VRAM_SEG: "VRAM", BLK_SEG: "BLOCK", OBJ_SEG: "OBJ",
                  FILE_SEG: "FILE"}

NIXL_INIT_AGENT = "NIXL_INIT_AGENT"
HAVE_UCX_GPU_DEVICE_API = False  # no device-initiated transfers (prep_mem_view): ferry has none
DEFAULT_COMM_PORT = 8888  # the listener's port (enable_listen_thread), as in NIXL

NIXL_READ = 0
NIXL_WRITE = 1

NIXL_THREAD_SYNC_NONE = 0
NIXL_THREAD_SYNC_STRICT = 1
NIXL_THREAD_SYNC_RW = 2
NIXL_THREAD_SYNC_DEFAULT = 3


class nixlError(RuntimeError):
    """Base of every nixl error. ``cause``: the ferry.Error behind it, if any."""

    def __init__(self, message, cause=None):
        super().__init__(message)
        self.cause = cause


class nixlInvalidParamError(nixlError, ValueError):
    pass


class nixlUnknownNameError(nixlInvalidParamError, KeyError):
    """An operation or memory type name NIXL does not know: a KeyError too,
    as NIXL's lookup of the name raises."""

    __str__ = BaseException.__str__


class nixlNotFoundError(nixlError):
    pass


class nixlNotSupportedError(nixlError):
    pass


class nixlNotAllowedError(nixlError):
    pass


class nixlBackendError(nixlError):
    pass


class nixlRepostActiveError(nixlError):
    pass


class nixlNoTelemetryError(nixlError):
    pass


def _as_desc_array(descs, columns, what):
    """(N x 3 uint64 array, list of N metadata strings) from tuples or an
    N x 3 (N x 4) integer array."""
    if isinstance(descs, np.ndarray):
        if descs.ndim != 2 or descs.shape[1] not in columns or descs.dtype.kind not in "iu":
            raise nixlInvalidParamError(
                f"{what}: an array of descriptors must be N x {' or N x '.join(map(str, columns))}"
                f" integers (addr, len, dev_id), got shape {descs.shape} of {descs.dtype}")
        if descs.dtype.kind == "i" and descs.size and descs.min() < 0:
            raise nixlInvalidParamError(f"{what}: a descriptor has a negative field")
        return np.ascontiguousarray(descs[:, :3], dtype=np.uint64), [""] * len(descs)
    rows, metas = [], []
    for i, d in enumerate(descs):
        if not isinstance(d, (tuple, list)) or len(d) not in columns:
            raise nixlInvalidParamError(
                f"{what}[{i}] must be a tuple of {' or '.join(map(str, columns))} fields "
                f"(addr, len, dev_id{', meta' if 4 in columns else ''}), got {d!r}")
        try:
            row = tuple(int(x) for x in d[:3])
        except (TypeError, ValueError):
            raise nixlInvalidParamError(f"{what}[{i}]: addr, len and dev_id must be integers, "
                                        f"got {d!r}") from None
        if min(row) < 0:
            raise nixlInvalidParamError(f"{what}[{i}] has a negative field: {d!r}")
        rows.append(row)
        metas.append(str(d[3]) if len(d) == 4 else "")
    return np.array(rows, dtype=np.uint64).reshape(len(rows), 3), metas


class _DescList:
    _columns = (3,)

    def __init__(self, mem_type, descs=(), *_ignored):
        if mem_type not in MEM_TYPE_NAMES:
            raise nixlInvalidParamError(f"unknown memory type {mem_type!r}")
        self.mem_type = mem_type
        self.descs, self.metas = _as_desc_array(descs, self._columns, type(self).__name__)

    def getType(self):
        return self.mem_type

    def descCount(self):
        return len(self.descs)

    def isEmpty(self):
        return len(self.descs) == 0

    def __len__(self):
        return len(self.descs)

    def __getitem__(self, i):
        a, n, d = (int(x) for x in self.descs[i])
        return (a, n, d)

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def __repr__(self):
        return f"{type(self).__name__}({MEM_TYPE_NAMES[self.mem_type]}, {len(self)} descriptors)"

    def __eq__(self, other):
        return (type(other) is type(self) and other.mem_type == self.mem_type and
                np.array_equal(other.descs, self.descs) and other.metas == self.metas)

    __hash__ = None  # mutable (addDesc, remDesc, clear)

    def addDesc(self, desc):
        rows, metas = _as_desc_array([desc], self._columns, f"{type(self).__name__}.addDesc")
        self.descs = np.concatenate([self.descs, rows])
        self.metas = self.metas + metas

    def remDesc(self, index):
        if not -len(self) <= index < len(self):
            raise IndexError(f"{type(self).__name__}.remDesc: index {index} of {len(self)}")
        i = index % len(self)
        self.descs = np.delete(self.descs, i, axis=0)
        self.metas = self.metas[:i] + self.metas[i + 1:]

    def clear(self):
        self.descs, self.metas = np.zeros((0, 3), dtype=np.uint64), []

    def print(self):
        print(repr(self))
        for d in self:
            print("  ", d)


class nixlXferDList(_DescList):
    """Transfer descriptors: (addr, len, dev_id) each."""


class nixlRegDList(_DescList):
    """Registration descriptors: (addr, len, dev_id, meta) each (meta may be left out)."""

    _columns = (3, 4)

    def __getitem__(self, i):
        return super().__getitem__(i) + (self.metas[i],)

    def trim(self):
        """The same descriptors as a nixlXferDList (the metadata strings left out)."""
        return nixlXferDList(self.mem_type, self.descs)


class nixlAgentConfig:
    """The settings an agent runs with, by the names of NIXL's binding layer
    (nixl_agent fills them in from nixl_agent_config and the environment)."""

    def __init__(self, syncMode=NIXL_THREAD_SYNC_NONE, captureTelemetry=False,
                 useListenThread=False, listenPort=0):
        self.syncMode = syncMode
        self.captureTelemetry = captureTelemetry
        self.useListenThread = useListenThread
        self.listenPort = listenPort


class nixlAgent:
    """An agent's name and settings (nixl_agent.agent). Every sync mode is
    served as strict: ferry's engine may be called from any thread."""

    def __init__(self, name, config):
        if not isinstance(name, str) or not name:
            raise nixlInvalidParamError("nixl_agent: the agent name must be a non-empty str")
        self.name = name
        self.config = config


class nixlXferTelemetry:
    """What one transfer took: ``startTime`` (µs since the epoch, at post),
    ``postDuration`` (µs the post call took), ``xferDuration`` (µs from post
    until the state was first seen DONE), ``totalBytes``, ``descCount``
    (descriptor pairs, before merging)."""

    def __init__(self, startTime=0, postDuration=0, xferDuration=0, totalBytes=0, descCount=0):
        self.startTime = startTime
        self.postDuration = postDuration
        self.xferDuration = xferDuration
        self.totalBytes = totalBytes
        self.descCount = descCount

    def __repr__(self):
        return (f"nixlXferTelemetry(postDuration={self.postDuration}, "
                f"xferDuration={self.xferDuration}, totalBytes={self.totalBytes}, "
                f"descCount={self.descCount})")
