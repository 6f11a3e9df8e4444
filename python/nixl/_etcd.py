"""nixl._etcd - NIXL's central metadata exchange through etcd, for agents
started with NIXL_ETCD_ENDPOINTS set (NIXL's variable; NIXL_ETCD_NAMESPACE
as in NIXL, default "/nixl/agents/").

The layout is NIXL's: an agent's metadata under
<namespace>/<agent>/<label> (label "metadata" for send_local_metadata, the
caller's for partial metadata), all of an agent's keys deleted when it
invalidates itself, and a reader that fetched an agent watches that
agent's keys and forgets it when they are deleted. The blobs are ferry's
(nixl._utils), so only ferry agents read each other's.

etcd is reached through its JSON gateway (/v3/kv/..., /v3/watch: etcd 3.4
and later) with the standard library, so nothing beyond Debian's python3 is
needed. Publishing and invalidating wait for etcd's answer and raise what
went wrong. A fetch returns at once: a worker thread reads the key, waits
for it up to the watch timeout (5 s, NIXL's default) when it is not there
yet, and loads it; what fails there is logged as an ERROR, as NIXL does,
and check_remote_metadata stays False.
"""

import base64
import http.client
import json
import queue
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

from nixl.logging import get_logger

log = get_logger("nixl")

DEFAULT_NAMESPACE = "/nixl/agents/"
DEFAULT_LABEL = "metadata"
WATCH_TIMEOUT_S = 5.0
_REQUEST_TIMEOUT_S = 5.0


class EtcdError(Exception):
    """etcd could not be reached, or refused a request."""


def _b64(s):
    return base64.b64encode(s.encode() if isinstance(s, str) else s).decode()


def _prefix_end(prefix):
    """The range_end that makes a key a prefix (etcd's convention)."""
    raw = bytearray(prefix.encode())
    raw[-1] += 1
    return bytes(raw)


def _endpoints(spec):
    """NIXL_ETCD_ENDPOINTS: comma-separated URLs (http://host:port), or bare host:port."""
    out = []
    for item in (s.strip() for s in spec.split(",")):
        if not item:
            continue
        url = urllib.parse.urlsplit(item if "://" in item else "http://" + item)
        if url.scheme != "http" or not url.hostname or url.port is None:
            raise EtcdError(f"NIXL_ETCD_ENDPOINTS: {item!r} is not http://host:port")
        out.append((url.hostname, url.port))
    if not out:
        raise EtcdError("NIXL_ETCD_ENDPOINTS is empty")
    return out


class EtcdMetadata:
    """One agent's view of etcd: publish, invalidate, fetch and watch.
    on_blob(agent, blob) loads fetched metadata; on_deleted(agent) forgets
    an agent whose keys were deleted. Both run on this object's threads."""

    def __init__(self, agent, endpoints, namespace, on_blob, on_deleted,
                 watch_timeout_s=WATCH_TIMEOUT_S):
        self.agent = agent
        self.endpoints = _endpoints(endpoints)
        self.namespace = namespace or DEFAULT_NAMESPACE
        self.watch_timeout_s = watch_timeout_s
        self._on_blob, self._on_deleted = on_blob, on_deleted
        self._jobs = queue.Queue()
        self._watches = {}  # agent -> (thread, connection)
        self._lock = threading.Lock()
        self._closed = False
        self._stopped = threading.Event()  # set by close: ends the waits between tries
        self._worker = threading.Thread(target=self._work, daemon=True,
                                        name=f"nixl-etcd-{agent}")
        self._worker.start()

    def key(self, agent, label):
        return f"{self.namespace}/{agent}/{label}"

    # ---- requests ------------------------------------------------------------

    def _post(self, path, body):
        """One JSON request to the first endpoint that answers."""
        last = None
        for host, port in self.endpoints:
            req = urllib.request.Request(f"http://{host}:{port}{path}", method="POST",
                                         data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=_REQUEST_TIMEOUT_S) as r:
                    return json.loads(r.read())
            except urllib.error.HTTPError as e:
                raise EtcdError(f"etcd at {host}:{port} refused {path}: HTTP {e.code} "
                                f"{e.read()[:200]!r}") from None
            except (OSError, ValueError) as e:
                last = f"etcd at {host}:{port}: {getattr(e, 'reason', e)}"
        raise EtcdError(f"{path}: no etcd endpoint answered ({last})")

    def put(self, label, blob):
        self._post("/v3/kv/put", {"key": _b64(self.key(self.agent, label)), "value": _b64(blob)})

    def get(self, agent, label):
        """(value or None, the store's revision)."""
        reply = self._post("/v3/kv/range", {"key": _b64(self.key(agent, label))})
        revision = int(reply.get("header", {}).get("revision", 0))
        kvs = reply.get("kvs") or []
        return (base64.b64decode(kvs[0].get("value", "")) if kvs else None), revision

    def delete_all(self):
        """Deletes every key of this agent: readers that watch it forget it."""
        prefix = self.key(self.agent, "")
        reply = self._post("/v3/kv/deleterange",
                           {"key": _b64(prefix), "range_end": _b64(_prefix_end(prefix))})
        return int(reply.get("deleted", 0))

    # ---- fetches, on the worker thread ----------------------------------------

    def fetch(self, agent, label):
        """Queues a fetch of agent's metadata under label."""
        self._jobs.put((agent, label))

    def _work(self):
        while True:
            job = self._jobs.get()
            if job is None:
                return
            try:
                self._fetch_now(*job)
            except Exception as e:  # the next fetch must still run
                log.error("nixl agent %s: fetching the metadata of agent %s from etcd: %s",
                          self.agent, job[0], e)

    def _fetch_now(self, agent, label):
        deadline = time.monotonic() + self.watch_timeout_s
        pause = 0.01
        while True:
            blob, revision = self.get(agent, label)
            if blob or self._closed:
                break
            if time.monotonic() >= deadline:
                raise EtcdError(f"key {self.key(agent, label)} did not appear within "
                                f"{self.watch_timeout_s:g} s")
            time.sleep(pause)
            pause = min(pause * 2, 0.1)
        if self._closed:
            return
        self._on_blob(agent, blob)
        try:
            self._watch(agent, revision + 1)
        except EtcdError as e:
            log.warning("nixl agent %s: the etcd watch on agent %s did not open (%s)", self.agent,
                        agent, e)
            self._watch_again(agent)

    # ---- watches: one stream per fetched agent --------------------------------

    def _watch(self, agent, start_revision):
        with self._lock:
            if agent in self._watches or self._closed:
                return
            conn, reply = self._open_watch(self.key(agent, ""), start_revision)
            thread = threading.Thread(target=self._watch_main, args=(agent, reply), daemon=True,
                                      name=f"nixl-etcd-watch-{agent}")
            self._watches[agent] = (thread, conn)
            thread.start()

    def _open_watch(self, prefix, start_revision):
        """A watch stream on prefix from the first endpoint that opens one."""
        last = None
        for host, port in self.endpoints:
            conn = http.client.HTTPConnection(host, port, timeout=_REQUEST_TIMEOUT_S)
            try:
                conn.request("POST", "/v3/watch", json.dumps({"create_request": {
                    "key": _b64(prefix), "range_end": _b64(_prefix_end(prefix)),
                    "start_revision": str(start_revision), "filters": ["NOPUT"]}}))
                reply = conn.getresponse()
                if reply.status == 200:
                    conn.sock.settimeout(None)  # a watch waits as long as the agent is known
                    return conn, reply
                last = f"etcd at {host}:{port}: HTTP {reply.status}"
            except (OSError, http.client.HTTPException) as e:
                last = f"etcd at {host}:{port}: {e}"
            conn.close()
        raise EtcdError(f"/v3/watch: no etcd endpoint answered ({last})")

    def _watch_main(self, agent, reply):
        try:
            for line in iter(reply.readline, b""):
                events = json.loads(line).get("result", {}).get("events") or []
                if any(e.get("type") == "DELETE" for e in events):
                    self._forget(agent, "was deleted from etcd")
                    return
        except (OSError, ValueError, http.client.HTTPException) as e:
            if not self._closed:
                log.warning("nixl agent %s: the etcd watch on agent %s broke (%s); watching "
                            "it again", self.agent, agent, e)
        with self._lock:
            self._watches.pop(agent, None)
        if not self._closed:
            self._watch_again(agent)

    def _forget(self, agent, why):
        log.info("nixl agent %s: agent %s's metadata %s; forgetting it", self.agent, agent, why)
        with self._lock:
            self._watches.pop(agent, None)
        self._on_deleted(agent)

    def _watch_again(self, agent):
        """After a watch stream ended (its etcd member died, or etcd ended
        it): what etcd holds now decides, so no deletion in between is
        missed: no key left, the agent is forgotten; else a new watch from
        this revision, on the first endpoint that answers. Until etcd
        answers, tried again with a growing pause (2 s at most)."""
        prefix = self.key(agent, "")
        pause, failed = 0.05, False
        while not self._closed:
            try:
                reply = self._post("/v3/kv/range", {"key": _b64(prefix),
                                                    "range_end": _b64(_prefix_end(prefix)),
                                                    "count_only": True})
                if int(reply.get("count", 0)) == 0:
                    self._forget(agent, "is gone from etcd")
                else:
                    self._watch(agent, int(reply.get("header", {}).get("revision", 0)) + 1)
                if failed:
                    log.info("nixl agent %s: watching agent %s again", self.agent, agent)
                return
            except EtcdError as e:
                if not failed:
                    log.error("nixl agent %s: cannot watch agent %s (%s); trying until etcd "
                              "answers", self.agent, agent, e)
                failed = True
            self._stopped.wait(pause)
            pause = min(pause * 2, 2.0)

    def close(self):
        with self._lock:
            self._closed = True
            watches, self._watches = list(self._watches.values()), {}
        self._stopped.set()
        self._jobs.put(None)
        for thread, conn in watches:
            try:
                conn.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            thread.join(timeout=5)
            conn.close()
        self._worker.join(timeout=self.watch_timeout_s + _REQUEST_TIMEOUT_S)
