"""msgspec structs shared by the SDK and the servers (DESIGN §1, §6).

Wire bodies are msgpack (JSON is accepted for humans).  Chunk bytes never travel inside
these structs: they go raw in HTTP bodies.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Literal
from urllib.parse import urlencode

import msgspec
import xxhash

from .chunks.names import ChunkKey, is_hex32, validate_hex32
from .errors import BadRequest, CorruptData

Codec = Literal["none", "lz4"]
# What a commit or delete writes: a user's blob, or an entry of a bucket's chunk index,
# blobsdk's own record in the namespace users cannot write (blobsdk/chunks/names.py)
WriteKind = Literal["blob", "index"]


class ChunkRef(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, dict=True):
    """Where the stored bytes of one chunk live and how to check them.

    ``dict=True`` gives each ref a ``__dict__`` (16 bytes, filled only once ``key`` is read)
    so that :attr:`key` is computed once per ref: an L1 hit asks for it on every read, and
    hashing the ref again cost ~0.7 of the ~10 µs a 4 KiB get from L1 took."""

    block_id: str
    offset: int  # byte offset of the stored bytes inside the block
    length: int  # stored (possibly compressed) length
    raw_length: int  # length once decoded
    checksum: int  # xxh3-64 of the raw bytes
    codec: Codec = "none"
    # The metadata API's grant to read these bytes, for the tenant that asked for the plan
    # (blobsdk.auth); "" when the API has no keyring.  Never stored, not part of the key.
    grant: str = ""

    def unsigned(self) -> ChunkRef:
        """This ref as stored: without a grant."""
        return msgspec.structs.replace(self, grant="") if self.grant else self

    @functools.cached_property
    def key(self) -> ChunkKey:
        """Cache key: names these exact bytes forever, because blocks are immutable.  It
        covers the whole ref, checksum and codec included, so bytes stored under a key
        always verify against the ref that names it: a cache client cannot store other
        bytes (with their own checksum) under the key of a real chunk."""
        ref = f"{self.block_id}/{self.offset}/{self.length}/{self.raw_length}/{self.checksum}/{self.codec}"
        return ChunkKey(xxhash.xxh3_128_hexdigest(ref.encode()))


class ReadPlan(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """The answer of getReadPlan: one immutable version of a blob."""

    path: str
    version: int  # assigned by the metadata store at commit; 0 in an uncommitted plan
    etag: str  # content hash of the chunk list
    size: int
    chunk_size: int
    chunks: tuple[ChunkRef, ...] = ()
    created: float = 0.0  # unix time of the commit
    grants_expire: int = 0  # unix time the chunks' grants expire; 0: the plan carries none

    def unsigned(self) -> ReadPlan:
        """This plan as stored: without grants."""
        if not self.grants_expire and not any(c.grant for c in self.chunks):
            return self
        chunks = tuple(c.unsigned() for c in self.chunks)
        return msgspec.structs.replace(self, chunks=chunks, grants_expire=0)

    def info(self) -> BlobInfo:
        return BlobInfo(
            path=self.path,
            size=self.size,
            version=self.version,
            etag=self.etag,
            created=self.created,
            chunks=len(self.chunks),
        )

    def block_ids(self) -> set[str]:
        return {c.block_id for c in self.chunks}


class BlobInfo(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What users see of a committed blob version."""

    path: str
    size: int
    version: int
    etag: str
    created: float = 0.0
    chunks: int = 0


class BlockInfo(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One stored L4 block."""

    block_id: str
    size: int
    created: float  # unix time the block became durable


# --- metadata API requests / responses -------------------------------------------------


class GetPlansRequest(msgspec.Struct, frozen=True, kw_only=True):
    paths: list[str]


class GetPlansResponse(msgspec.Struct, frozen=True, kw_only=True):
    plans: list[ReadPlan | None]  # aligned with the request; None = not found


class CommitOp(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One commit of ``commit_many``.  ``kind="blob"`` (a user's write) is refused under
    ``/{bucket}/.blobsdk/``; ``kind="index"`` is only a chunk index entry: its path exactly
    ``/{bucket}/.blobsdk/chunks/<32 hex>`` and its plan one chunk (blobsdk/metadata/base.py)."""

    path: str
    plan: ReadPlan
    if_version: int | None = None  # None: unconditional; 0: create-only; N: must be at N
    kind: WriteKind = "blob"


class CommitRequest(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    ops: list[CommitOp]
    request_id: str | None = None  # 32 hex: a retry of the same write is applied once (RetryAwareStore)


class CommitResponse(msgspec.Struct, frozen=True, kw_only=True):
    plans: list[ReadPlan]


class DeleteRequest(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    path: str
    if_version: int | None = None
    kind: WriteKind = "blob"  # "index": gc removing an index entry (or a stray under .blobsdk/)
    request_id: str | None = None  # as CommitRequest's


class DeleteResponse(msgspec.Struct, frozen=True, kw_only=True):
    deleted: BlobInfo


class ListRequest(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    prefix: str
    start_after: str | None = None
    limit: int = 1000


class ListResponse(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    items: list[BlobInfo]
    next_start_after: str | None = None  # None: this was the last page


class ListBlocksResponse(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    blocks: list[BlockInfo]
    next_start_after: str | None = None


class ErrorBody(msgspec.Struct, frozen=True, kw_only=True):
    code: str
    message: str


MSGPACK = "application/msgpack"
JSON = "application/json"
MAX_BODY_BYTES = 16 << 20  # the servers' bound on msgpack/JSON request bodies
MAX_CHUNK_BYTES = 64 << 20  # the largest chunk (raw bytes) a plan may name; the L3 node's default limit
MAX_LIST_BLOCKS = 10_000  # block ids a block server lists per page
MAX_PATHS_PER_REQUEST = 1000  # the API server's bound on GetPlansRequest.paths
MAX_OPS_PER_REQUEST = 1000  # the API server's bound on CommitRequest.ops
# How long a server waits on a client (blobsdk/net/serving.py; each has a serve flag).
HEADER_TIMEOUT_S = 10.0  # a request head must be complete this long after its first byte
BODY_TIMEOUT_S = 30.0  # a request body that gets no bytes this long is answered 408
KEEPALIVE_TIMEOUT_S = 15.0  # an idle connection is closed after this long
MAX_CONNECTIONS = 512  # open connections per server; beyond it new ones get a 503 and are closed

_encoder = msgspec.msgpack.Encoder()


def encode(obj: object) -> bytes:
    """msgpack-encode a wire struct."""
    return _encoder.encode(obj)


def etag_of(chunks: tuple[ChunkRef, ...] | list[ChunkRef], size: int) -> str:
    """Content etag: xxh3-128 over the raw checksums and lengths of the chunks."""
    h = xxhash.xxh3_128()
    h.update(size.to_bytes(8, "little"))
    for c in chunks:
        h.update(c.checksum.to_bytes(8, "little"))
        h.update(c.raw_length.to_bytes(8, "little"))
    return h.hexdigest()


class ScanRequest(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Page through every live plan, sorted by path (garbage collection)."""

    start_after: str | None = None
    limit: int = 1000


class NamingRequest(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Page through the live plans naming any of ``block_ids`` (MetadataStore.naming_page:
    repair); answered as a ScanResponse.  Admin only."""

    block_ids: list[str]
    start_after: str | None = None
    limit: int = 1000


class ScanResponse(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    plans: list[ReadPlan]
    next_start_after: str | None = None


class FenceRequest(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """gc's fences (MetadataStore.fence_blocks / unfence_blocks / prune_fences): admin only."""

    action: Literal["add", "remove", "prune"]
    block_ids: list[str] = msgspec.field(default_factory=list)
    older_than: float = 0.0


class FenceResponse(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    pruned: int = 0


# --- L3 flash nodes (servers/flash.py) ---------------------------------------------------
#
#     GET    /v1/chunks/{key}?<chunk query>   stored bytes; X-Blobsdk-Cache: hit | miss
#            [X-Blobsdk-Progress: MS]   interim 102 Processing every MS ms until the reply
#     PUT    /v1/chunks/{key}?<chunk query>[&pin_seconds=S]   body = stored bytes; 201
#     POST   /v1/hydrate      HydrateRequest -> 202 HydrateStatus (pull chunks from L4, pinned)
#     GET    /v1/hydrate/{id} HydrateStatus;  DELETE cancels the job
#
# The chunk query is the ChunkRef as query parameters (chunk_query); ``key`` must be its
# chunk key.

CACHE_HEADER = "X-Blobsdk-Cache"  # "hit": served from the node's flash; "miss": read through L4
# A chunk GET may ask for "102 Processing" every MS ms while the node works on it (reading
# it through from L4), so the client does not take a node queued behind L4 for hung; a block
# server's GET (servers/blockstore.py) takes the same ask while it queues for a spindle.
PROGRESS_HEADER = "X-Blobsdk-Progress"
MIN_PROGRESS_MS, MAX_PROGRESS_MS = 10.0, 60_000.0
HYDRATE_BATCH = 10_000  # refs per hydrate request (keeps bodies far below MAX_BODY_BYTES)
MAX_FAILED_KEYS = 1000  # failed chunk keys a hydrate status lists
_REF_FIELDS = ("block_id", "offset", "length", "raw_length", "checksum", "codec")
_UINT64 = 1 << 64

JobState = Literal["running", "done", "failed", "cancelled"]


class HydrateRequest(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Pull these chunks from L4 into the node and pin them (None: the node's default)."""

    refs: list[ChunkRef]
    pin_seconds: float | None = None


class HydrateStatus(msgspec.Struct, frozen=True, kw_only=True):
    """Progress of one hydrate job: ``done`` chunks are stored and pinned, ``failed`` ones
    are not; the job ends "done" when none failed, else "failed" (or "cancelled")."""

    job_id: str
    state: JobState
    total: int
    done: int = 0
    failed: int = 0
    bytes: int = 0
    errors: list[str] = []  # the first few failures
    failed_keys: list[str] = []  # the keys of the failed chunks (the first MAX_FAILED_KEYS)

    @property
    def finished(self) -> bool:
        return self.state != "running"


def chunk_query(ref: ChunkRef) -> str:
    """``ref`` as URL query parameters."""
    return urlencode({name: getattr(ref, name) for name in _REF_FIELDS})


def ref_from_query(query: Mapping[str, str]) -> ChunkRef:
    """The ChunkRef named by query parameters; BadRequest if any is missing or invalid."""
    try:
        ref = msgspec.convert({k: query[k] for k in _REF_FIELDS if k in query}, ChunkRef, strict=False)
    except msgspec.ValidationError as exc:
        raise BadRequest(f"invalid chunk reference: {exc}") from exc
    return validate_ref(ref)


def validate_ref(ref: ChunkRef) -> ChunkRef:
    validate_hex32(ref.block_id, "block id")
    if min(ref.offset, ref.length, ref.raw_length) < 0 or not 0 <= ref.checksum < _UINT64:
        raise BadRequest(f"invalid chunk reference {ref}: negative span or checksum out of range")
    return ref


# --- the rules every ReadPlan obeys, checked where a plan is committed and where one arrives ----
#
# A plan is valid when:
#
# - ``size >= 0`` and ``1 <= chunk_size <= MAX_CHUNK_BYTES`` (64 MiB);
# - every chunk names a valid block id (32 lowercase hex digits), has ``offset >= 0``, a
#   checksum in 64 bits, and ``1 <= raw_length <= chunk_size``;
# - a chunk's stored ``length`` fits its codec: ``length == raw_length`` for ``"none"``,
#   ``1 <= length <= lz4_bound(raw_length)`` for ``"lz4"``;
# - the chunks cover exactly ``size`` bytes: their raw lengths sum to ``size``.
#
# So a plan never makes a reader allocate more than its chunks hold, or read bytes that are
# not in a chunk, and its block ids are safe as file names and URL segments.  A bad plan is
# BadRequest when committed (check_plan: blobsdk/metadata/base.py) and CorruptData when it
# comes back from a store (checked_plan: blobsdk/metadata/backend.py, where a plan enters).


def lz4_bound(raw_length: int) -> int:
    """The most bytes lz4 block compression can turn ``raw_length`` bytes into (LZ4_COMPRESSBOUND)."""
    return raw_length + raw_length // 255 + 16


def check_plan(plan: ReadPlan) -> ReadPlan:
    """``plan`` if it obeys the rules above, else BadRequest naming the first broken one."""
    if plan.size < 0:
        raise BadRequest(f"plan for {plan.path!r}: negative size {plan.size}")
    if not 1 <= plan.chunk_size <= MAX_CHUNK_BYTES:
        raise BadRequest(f"plan for {plan.path!r}: chunk_size {plan.chunk_size} is not from 1 to {MAX_CHUNK_BYTES}")
    covered = 0
    for index, ref in enumerate(plan.chunks):
        if problem := chunk_problem(ref, plan.chunk_size):
            raise BadRequest(f"plan for {plan.path!r}: chunk {index}: {problem}")
        covered += ref.raw_length
    if covered != plan.size:
        raise BadRequest(f"plan for {plan.path!r}: chunks cover {covered} bytes, size is {plan.size}")
    return plan


def chunk_problem(ref: ChunkRef, chunk_size: int) -> str | None:
    """What is wrong with one chunk of a plan whose chunk size is ``chunk_size``, or None."""
    if not is_hex32(ref.block_id):
        return f"invalid block id {ref.block_id!r}: want 32 lowercase hex digits"
    if ref.offset < 0 or not 0 <= ref.checksum < _UINT64:
        return f"negative offset {ref.offset} or checksum {ref.checksum} out of 64 bits"
    if not 1 <= ref.raw_length <= chunk_size:
        return f"raw_length {ref.raw_length} is not from 1 to chunk_size {chunk_size}"
    if ref.codec == "none" and ref.length != ref.raw_length:
        return f"uncompressed chunk with length {ref.length} != raw_length {ref.raw_length}"
    if ref.codec == "lz4" and not 1 <= ref.length <= lz4_bound(ref.raw_length):
        return f"lz4 chunk with length {ref.length} is not from 1 to {lz4_bound(ref.raw_length)} (raw_length {ref.raw_length})"
    return None


def checked_plan(plan: ReadPlan, path: str) -> ReadPlan:
    """``plan`` as a store answered it for ``path``: CorruptData unless it is a valid plan of
    ``path`` (a reader must never see zeros or allocate for bytes no chunk holds)."""
    try:
        if plan.path != path:
            raise BadRequest(f"plan for {plan.path!r}, not for {path!r}")
        return check_plan(plan)
    except BadRequest as exc:
        raise CorruptData(f"metadata store returned an invalid plan: {exc}") from exc


# --- the tracker (servers/tracker.py): Owl's control plane of the peer tier ------------------------


TRACKER_MAX_KEYS = 4096  # keys (or refs) per list of one tracker request: clients split past it


class PeerHello(msgspec.Struct, frozen=True, kw_only=True):
    """A peer registering, and every heartbeat after: who it is, where it serves, how busy."""

    peer_id: str  # hex32, chosen by the peer
    address: str  # the base URL its peer server answers on, e.g. "http://10.0.0.7:7400"
    serve_key: str  # hex: the secret its trackers sign its serve tickets with (blobsdk.auth.ServeKey)
    uploads: int = 0  # uploads in flight now
    budget_bytes: int = 0  # serving memory it offers


class HelloResponse(msgspec.Struct, frozen=True, kw_only=True):
    heartbeat_s: float  # say hello again within this
    ttl_s: float  # a peer not heard from for this long is forgotten
    tenant: str  # the tenant the peer is bound to: the only one it serves
    # This hello registered the peer: the tracker knew nothing of it (it restarted, or the
    # peer aged out), so it knows none of the peer's copies: the peer announces them again.
    registered: bool = False


class LocateRequest(msgspec.Struct, frozen=True, kw_only=True):
    peer_id: str  # who asks (it becomes a fetcher of each key, a source for later askers)
    refs: list[ChunkRef]  # with their grants: the tracker checks them before it hands out a source


class Source(msgspec.Struct, frozen=True, kw_only=True):
    peer_id: str
    address: str
    complete: bool  # holds the whole chunk; False: still fetching it (it serves it once it lands)
    ticket: str  # the source's serve ticket for the asker (blobsdk.auth.ServeKey)


class Located(msgspec.Struct, frozen=True, kw_only=True):
    key: str
    sources: list[Source]  # best first; empty: fetch from the origin (L3/L4)


class LocateResponse(msgspec.Struct, frozen=True, kw_only=True):
    located: list[Located]


class AnnounceRequest(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    peer_id: str
    filled: list[str] = []  # fetched whole and verified
    failed: list[str] = []  # fetches given up
    evicting: list[str] = []  # about to be evicted (the tracker may say hold)
    evicted: list[str] = []  # gone


class AnnounceResponse(msgspec.Struct, frozen=True, kw_only=True):
    keep: list[str]  # of ``filled``: keep these in the serving cache; drop the rest when it suits
    hold: list[str]  # of ``evicting``: the last copies others still ask for, keep them ``hold_s`` more
    hold_s: float


# bad_bytes: failed verification; failed: an error or timeout; refused: busy (429);
# missing: it no longer has the chunk (404: a stale entry, no fault of the peer's).
Problem = Literal["bad_bytes", "failed", "refused", "missing"]


class ReportRequest(msgspec.Struct, frozen=True, kw_only=True):
    peer_id: str  # who reports
    source: str  # the peer it reports
    key: str
    problem: Problem


class ReportResponse(msgspec.Struct, frozen=True, kw_only=True):
    banned: bool  # the source will not be handed out again
