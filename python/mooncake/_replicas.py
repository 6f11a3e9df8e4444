"""Mooncake's replica descriptors (get_replica_desc, batch_get_replica_desc):
where a stored object is, as ferry's master knows it (ferry.h's
ferry_store_replicas_batch). Mooncake's names; docs/store.md "Where an
object is" says which of its fields have a meaning here."""

import enum

# ferry.h's ferry_store_replica_kind, and Mooncake's ReplicaType names.
_KINDS = {1: "MEMORY", 2: "DISK", 3: "LOCAL_DISK"}


class ReplicaStatus(enum.IntEnum):
    """Mooncake's; ferry lists only complete replicas (COMPLETE)."""
    UNDEFINED = 0
    INITIALIZED = 1
    PROCESSING = 2
    COMPLETE = 3
    REMOVED = 4
    FAILED = 5


class Descriptor:
    """A memory replica's buffer (Mooncake's AllocatedBuffer::Descriptor):
    its size, its address in the segment's owner, and the segment's name
    as transport_endpoint (the name a ferry client reads it by)."""

    def __init__(self, size=0, buffer_address=0, transport_endpoint=""):
        self.size = size
        self.buffer_address = buffer_address
        self.transport_endpoint = transport_endpoint

    def __repr__(self):
        return (f"<Descriptor size={self.size} buffer_address={self.buffer_address} "
                f"transport_endpoint={self.transport_endpoint}>")


class MemoryDescriptor:
    def __init__(self, buffer_descriptor):
        self.buffer_descriptor = buffer_descriptor


class DiskDescriptor:
    """A --root_fs_dir file: its path on the master's host (the same path
    on every client's, docs/store.md "The SSD tier") and the value's size."""

    def __init__(self, file_path, object_size):
        self.file_path = file_path
        self.object_size = object_size


class LocalDiskDescriptor:
    """The copy on its owner's disk (--enable_offload): transport_endpoint
    names the owner's segment; ferry has no client ids (client_id None)."""

    def __init__(self, object_size, transport_endpoint):
        self.client_id = None
        self.object_size = object_size
        self.transport_endpoint = transport_endpoint


class ReplicaDescriptor:
    """One place of an object. type ("MEMORY", "DISK" or "LOCAL_DISK") and
    location are ferry's additions; the rest is Mooncake's binding."""

    def __init__(self, kind, location, address, size):
        self.type = _KINDS.get(kind, "UNKNOWN")
        self.location = location
        self.status = ReplicaStatus.COMPLETE
        self._address = address
        self._size = size

    def is_memory_replica(self):
        return self.type == "MEMORY"

    def is_disk_replica(self):
        return self.type == "DISK"

    def is_local_disk_replica(self):
        return self.type == "LOCAL_DISK"

    def get_memory_descriptor(self):
        if not self.is_memory_replica():
            raise RuntimeError("Expected MemoryDescriptor")
        return MemoryDescriptor(Descriptor(self._size, self._address, self.location))

    def get_disk_descriptor(self):
        if not self.is_disk_replica():
            raise RuntimeError("Expected DiskDescriptor")
        return DiskDescriptor(self.location, self._size)

    def get_local_disk_descriptor(self):
        if not self.is_local_disk_replica():
            raise RuntimeError("Expected LocalDiskDescriptor")
        return LocalDiskDescriptor(self._size, self.location)

    def __repr__(self):
        return f"<ReplicaDescriptor {self.type} {self.location} status={self.status.name}>"


def descriptors(answer):
    """One key's batch_replicas answer as descriptors (None: absent)."""
    if answer is None:
        return None
    size, replicas = answer
    return [ReplicaDescriptor(kind, location, address, size)
            for kind, location, address in replicas]
