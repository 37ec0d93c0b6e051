"""Verify a committed directory without decoding (or keeping) its tensors; no torch.

The checks of :func:`recovery.integrity.reads.reader.read_verified`, in its order and
with its errors: signature, trust and listing (:func:`.listed.check`), each
file's digest, every listed file claimed by ``state.json``. What differs is
what stays in memory: a tensor file is hashed in one streamed pass that keeps
only its header's bytes (:func:`recovery.format.safeheader.read_hashed`), a
JSON or YAML document its verified bytes, anything else (a DCP shard, an
exported program) nothing. So the header :meth:`Checked.header` parses, and
each document, are the very bytes that were hashed. ``recovery ls`` and
``recovery verify`` verify through this (:func:`recovery.run.restoring.choose.check`);
resuming reads the bytes it decodes through ``read_verified``.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from recovery.errors import FormatError
from recovery.format import claims, digests, safeheader
from recovery.format.layout import TENSOR_SUFFIX
from recovery.format.manifest import FileRecord, Manifest
from recovery.format.safeheader import Entry
from recovery.format.statedoc import ROWS
from recovery.integrity.keys.signing import TrustStore
from recovery.integrity.reads import listed
from recovery.progress import bytes_bar

DOCUMENT_SUFFIXES = (".json", ".yaml")
"""Files whose verified bytes are kept: ``state.json``, ``config.yaml``, shard indexes, ..."""


@dataclass(frozen=True)
class Checked:
    """A verified directory: its manifest, its documents' verified bytes, and the verified
    first bytes (up to the header's end) of each tensor file."""

    path: Path
    manifest: Manifest
    documents: dict[str, bytes]
    heads: dict[str, bytes] = field(repr=False)
    sizes: dict[str, int] = field(repr=False)
    rows: dict[tuple[str, str], bytes] = field(default_factory=dict, repr=False)
    """The verified bytes of each delta row-index tensor, by (file, stored key)."""

    def row_bytes(self, name: str, key: str) -> bytes | None:
        """The verified bytes of tensor ``key`` of file ``name``, a delta's row indexes
        (``None``: no such row-index tensor)."""
        return self.rows.get((name, key))

    def document(self, name: str) -> bytes | None:
        """A listed document's verified bytes (``None``: not listed, or not a document)."""
        return self.documents.get(name)

    def header(self, name: str) -> dict[str, Entry] | None:
        """A listed tensor file's checked header entries by name (``None``: not listed).

        Raises:
            FormatError: naming the file, its header is not a well-formed safetensors header.
        """
        if name not in self.heads:
            return None
        head = safeheader.parse(self.heads[name], self.sizes[name], name=str(self.path / name))
        return {e.key: e for e in head.entries}


def check(path: str | Path, trust: TrustStore, *, allow_untrusted: bool = False) -> Checked:
    """Verify the signature, trust, listing and every file's digest of a committed directory,
    and that ``state.json`` claims every listed file; decode no tensor.

    Raises:
        What :func:`recovery.integrity.reads.reader.read_verified` raises, for the same failures.
    """
    path = Path(path)
    with listed.readable(path):
        return _check(path, trust, allow_untrusted=allow_untrusted)


def _check(path: Path, trust: TrustStore, *, allow_untrusted: bool) -> Checked:
    mf, sizes = listed.check(path, trust, allow_untrusted=allow_untrusted)
    lock = threading.Lock()
    rows: dict[tuple[str, str], bytes] = {}
    with bytes_bar(sum(sizes.values()), f"verifying {path.name}") as bar:

        def progress(n: int) -> None:
            with lock:
                bar(n)

        def one(rec: FileRecord) -> tuple[str, bytes]:
            file = path / rec.name
            if rec.name.endswith(TENSOR_SUFFIX):
                size = sizes[rec.name]
                found: dict[tuple[int, int], str] = {}  # the row-index tensors' spans

                def spans(head: bytes) -> list[tuple[int, int]]:
                    found.update(_row_spans(head, size, str(file)))
                    return list(found)

                digest, head, got = safeheader.read_hashed(
                    file, size=size, algorithm=mf.hash_type, progress=progress, also=spans
                )
                with lock:
                    rows.update({(rec.name, key): got[span] for span, key in found.items()})
                return digest, head
            if rec.name.endswith(DOCUMENT_SUFFIXES):
                data = listed.read_nofollow(file)
                progress(len(data))
                return digests.of(data, mf.hash_type), data
            return digests.hash_file(file, algorithm=mf.hash_type, progress=progress)[0], b""

        order = sorted(mf.files, key=lambda r: -sizes[r.name])  # largest first, as the reader
        with ThreadPoolExecutor(digests.workers(len(order)), "recovery-hash") as pool:
            futures = {rec.name: pool.submit(one, rec) for rec in order}
    kept: dict[str, bytes] = {}
    for rec in mf.files:  # the first failure in listed order is the one reported
        digest, data = futures[rec.name].result()
        if digest != rec.digest:
            raise listed.mismatch(path / rec.name, mf.hash_type, rec.digest, digest)
        kept[rec.name] = data
    documents = {n: b for n, b in kept.items() if n.endswith(DOCUMENT_SUFFIXES)}
    heads = {n: b for n, b in kept.items() if n.endswith(TENSOR_SUFFIX)}
    claims.check(path, kept, documents.get)
    return Checked(path, mf, documents, heads, {n: sizes[n] for n in heads}, rows)


def _row_spans(head: bytes, size: int, name: str) -> dict[tuple[int, int], str]:
    """The byte ranges of a tensor file's delta row-index tensors, by their stored key
    (none when the header does not parse: :meth:`Checked.header` names that later)."""
    try:
        header = safeheader.parse(head, size, name=name)
    except FormatError:
        return {}
    return {
        (header.start + e.begin, header.start + e.end): e.key
        for e in header.entries
        if e.key.startswith(ROWS)
    }
