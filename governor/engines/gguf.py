"""What a GGUF model file says about itself: architecture, shapes and tensor sizes.

Only the header is read (key/value and tensor-info sections, walked with a buffered file;
tensor data is never touched), so a 1.1 GiB model costs ~0.1 s. The package's own reader,
``gguf.GGUFReader``, decodes every vocabulary string (14 s for a 151936-token model on the
project's 2-core machine), so it serves only the type tables here. The `gguf` package is an optional extra
(a core dependency); it is imported only here, and only when needed.

GGUF layout and key names: ggml/docs/gguf.md and gguf-py/gguf/constants.py of llama.cpp
(``<arch>.block_count``, ``<arch>.embedding_length``, ``<arch>.attention.head_count[_kv]``,
``<arch>.context_length``, ``<arch>.attention.key_length/value_length``).

The parsed header is cached (:func:`read_gguf_cached`) as JSON keyed by the file's identity
(device, inode, size, mtime): importing `gguf` (and numpy with it) is ~140 ms and ~125 modules
on every `governor launch` of a GGUF model otherwise, more from a cold page cache. Cache
directory: ``$GOVERNOR_CACHE_DIR``, else /var/cache/governor as root, else
``$XDG_CACHE_HOME/governor`` (~/.cache/governor). A cache that cannot be read or written is
ignored (the header is parsed as without it); a changed file is a different key.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
import struct
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, BinaryIO

from governor.atomic import write_atomic
from governor.cache.store import cache_dir
from governor.errors import HostError, PolicyError, PolicyNotFound

GGUF_MAGIC = b"GGUF"
GGUF_MIN_VERSION = 2  # v1 (2023) used 32-bit counts; llama.cpp no longer reads it
GGML_MAX_DIMS = 4
MIN_HEADER_BYTES = 24  # magic u32, version u32, n_tensors u64, n_kv u64 (gguf.md "File Structure")


@dataclass(frozen=True)
class Tensor:
    name: str
    type: str  # ggml type name, e.g. "Q4_0", "F32"
    n_elements: int
    n_bytes: int
    rows: int  # ne[1] (1 for vectors): repack needs it to divide by the interleave


@dataclass(frozen=True)
class GgufInfo:
    """Header facts of one model file (pure data; see ``read_gguf``)."""

    path: str
    file_bytes: int
    architecture: str
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    n_ctx_train: int
    vocab: int
    key_length: int  # per-head K width (defaults to n_embd / n_head)
    value_length: int
    file_type: str | None
    tensors: tuple[Tensor, ...]
    # <arch>.attention.sliding_window (0: none): llama-server checkpoints the SWA part of a slot
    sliding_window: int = 0
    # a recurrent/hybrid model (ssm/wkv keys): its checkpoints hold a state the estimate does
    # not size
    recurrent: bool = False

    @property
    def n_embd_k(self) -> int:
        """K width per token and layer: n_head_kv x head_dim (GQA shrinks it)."""
        return self.n_head_kv * self.key_length

    @property
    def n_embd_v(self) -> int:
        return self.n_head_kv * self.value_length

    @property
    def tensor_bytes(self) -> int:
        return sum(t.n_bytes for t in self.tensors)

    @property
    def quant(self) -> str:
        """The most common 2-D weight type by bytes (what people call the model's quant)."""
        by: dict[str, int] = {}
        for t in self.tensors:
            if t.rows > 1:
                by[t.type] = by.get(t.type, 0) + t.n_bytes
        return max(by, key=lambda k: by[k]) if by else "F32"

    def types(self) -> dict[str, int]:
        """Bytes per tensor type."""
        out: dict[str, int] = {}
        for t in self.tensors:
            out[t.type] = out.get(t.type, 0) + t.n_bytes
        return out


CACHE_VERSION = 2  # bump when GgufInfo or the parse changes


def _cache_file(path: Path, st: os.stat_result, directory: Path) -> Path:
    ident = (
        f"{CACHE_VERSION}|{path.resolve()}|{st.st_dev}|{st.st_ino}|{st.st_size}|{st.st_mtime_ns}"
    )
    return directory / "gguf" / (hashlib.sha256(ident.encode()).hexdigest()[:32] + ".json")


def _from_json(text: str, path: Path) -> GgufInfo:
    data = json.loads(text)
    tensors = tuple(Tensor(**t) for t in data.pop("tensors"))
    data["path"] = str(path)
    return GgufInfo(**data, tensors=tensors)


def read_gguf_cached(path: Path, directory: Path | None = None) -> GgufInfo:
    """:func:`read_gguf` through the header cache (same errors, same result)."""
    try:
        st = path.stat()
    except OSError:
        return read_gguf(path)  # the uncached path says what is wrong with the file
    entry = _cache_file(path, st, directory or cache_dir())
    # the cache is untrusted input too: anything wrong in an entry means "read the file"
    with contextlib.suppress(OSError, ValueError, TypeError, KeyError, AttributeError):
        return _from_json(entry.read_text(), path)
    info = read_gguf(path)
    with contextlib.suppress(OSError):
        entry.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(entry, json.dumps(asdict(info)), 0o600)
    return info


def _gguf_module() -> Any:
    try:
        import gguf  # type: ignore[import-untyped,unused-ignore]
    except ImportError as err:
        raise HostError(
            "reading GGUF headers needs the python package `gguf`, which is not installed",
            hint="pip install gguf (a dependency of cgroup-governor: reinstall cgroup-governor)",
            missing=("gguf",),
        ) from err
    return gguf


def _corrupt(path: Path, why: str) -> PolicyError:
    return PolicyError(
        f"not a readable GGUF model: {why}",
        file=str(path),
        hint="the file is truncated or not a GGUF model: download or convert it again",
    )


def read_gguf(path: Path) -> GgufInfo:
    """Parse ``path``'s header. 66 when missing, 65 when corrupt/truncated, 69 without gguf."""
    size, fields, n_tokens, tensors, file_type = read_header(path)
    return info_from_fields(
        str(path),
        size=size,
        fields=fields,
        n_tokens=n_tokens,
        tensors=tensors,
        file_type=file_type,
        corrupt=_corrupt,
    )


def read_header(path: Path) -> tuple[int, dict[str, Any], int, tuple[Tensor, ...], str | None]:
    """(file size, key/value fields, vocabulary size, tensors, file type) of any GGUF file, a
    text model or a projector (governor/engines/projector.py); the errors of read_gguf."""
    try:
        st = path.stat()
        size = st.st_size
        if not stat.S_ISREG(st.st_mode):  # a FIFO would block the read forever
            raise _corrupt(path, "not a regular file")
        with path.open("rb") as f:
            head = f.read(MIN_HEADER_BYTES)
    except OSError as err:
        raise PolicyNotFound(
            f"model file not readable: {path} ({err.strerror})",
            file=str(path),
            hint="check the model path",
        ) from err
    if len(head) < MIN_HEADER_BYTES:
        raise _corrupt(path, f"{size} bytes, shorter than a GGUF header")
    if head[:4] != GGUF_MAGIC:
        raise _corrupt(path, f"magic {head[:4]!r}, expected {GGUF_MAGIC!r}")
    gguf = _gguf_module()
    try:
        with path.open("rb") as f:
            fields, n_tokens, raw = _walk_header(f, size)
        tensors = tuple(_tensor(gguf, *t) for t in raw)
        _check_length(fields.pop(_HEADER_END), fields.pop(_OFFSETS), tensors, fields, size)
        ftype = fields.get("general.file_type")
        file_type = (
            gguf.LlamaFileType(int(ftype)).name.removeprefix("MOSTLY_")
            if isinstance(ftype, int)
            else None
        )
    except _Corrupt as err:
        raise _corrupt(path, str(err)) from err
    except (ValueError, KeyError, struct.error, OverflowError) as err:  # unknown enum values
        raise _corrupt(path, f"{type(err).__name__}: {err}") from err
    return size, fields, n_tokens, tensors, file_type


class _Corrupt(Exception):
    pass


def _check_length(
    header_end: int, offsets: list[int], tensors: tuple[Tensor, ...], fields: dict[str, Any],
    size: int,
) -> None:  # fmt: skip
    """The file must hold the tensor data its header describes: a download cut off after the
    header would otherwise estimate fine and fail (or crash) only when the engine maps it."""
    align = fields.get("general.alignment", DEFAULT_ALIGNMENT)
    if not isinstance(align, int) or align <= 0 or align & (align - 1):
        raise _Corrupt(f"general.alignment {align!r} is not a power of two")
    start = -(-header_end // align) * align
    end = max((o + t.n_bytes for o, t in zip(offsets, tensors, strict=True)), default=0)
    if start + end > size:
        raise _Corrupt(
            f"tensor data cut off: the file is {size} bytes, its tensors end at byte {start + end}"
        )


# GGUF value types (gguf.md "GGUFValueType"): struct format of the scalar ones
_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q",
           11: "<q", 12: "<d"}  # fmt: skip
_STRING, _ARRAY = 8, 9
MAX_COUNT = 1 << 24  # more keys, tensors, array items or dims than any model has: corrupt
MAX_STRING = 1 << 26
MAX_ARRAY_NESTING = 4  # a vocabulary is an array of strings; ~1100 levels blew the stack
DEFAULT_ALIGNMENT = 32  # gguf.md: general.alignment, when absent
_HEADER_END, _OFFSETS = "\0header_end", "\0offsets"  # carried out of _walk_header in fields


def _walk_header(f: BinaryIO, size: int) -> tuple[dict[str, Any], int, list[tuple[Any, ...]]]:
    """Read the key/value and tensor-info sections only, skipping array contents (a 151936-token
    vocabulary is walked, not decoded): milliseconds, where gguf.GGUFReader takes seconds."""

    def read(n: int) -> bytes:
        b = f.read(n)
        if len(b) != n:
            raise _Corrupt(f"truncated header at byte {f.tell()} of {size}")
        return b

    def u32() -> int:
        return int(struct.unpack("<I", read(4))[0])

    def u64() -> int:
        return int(struct.unpack("<Q", read(8))[0])

    def count(what: str, min_bytes: int = 1) -> int:
        n = u64()
        # each item takes at least min_bytes of what is left: a count the file cannot hold is
        # refused at once (2^24 empty strings took 11 s to walk)
        if n > MAX_COUNT or n * min_bytes > size - f.tell():
            raise _Corrupt(f"implausible {what} count {n} at byte {f.tell() - 8} of {size}")
        return n

    def string() -> str:
        n = u64()
        if n > MAX_STRING:
            raise _Corrupt(f"implausible string length {n} at byte {f.tell() - 8}")
        return read(n).decode("utf-8", errors="replace")

    def value(vtype: int, depth: int = 0) -> Any:
        if depth > MAX_ARRAY_NESTING:
            raise _Corrupt(f"arrays nested deeper than {MAX_ARRAY_NESTING} at byte {f.tell()}")
        if vtype in _SCALAR:
            fmt = _SCALAR[vtype]
            return struct.unpack(fmt, read(struct.calcsize(fmt)))[0]
        if vtype == _STRING:
            return string()
        if vtype == _ARRAY:
            itype = u32()
            item = struct.calcsize(_SCALAR[itype]) if itype in _SCALAR else 8  # len or header
            n = count("array item", item)
            if itype in _SCALAR:
                f.seek(n * item, 1)
            else:
                for _ in range(n):
                    value(itype, depth + 1)
            return _Array(n)
        raise _Corrupt(f"unknown value type {vtype} at byte {f.tell() - 4}")

    magic, version = read(4), u32()
    if magic != GGUF_MAGIC or version < GGUF_MIN_VERSION:
        raise _Corrupt(f"magic {magic!r} version {version}: GGUF v2+ expected")
    n_tensors, n_kv = count("tensor", 24), count("key", 12)
    fields: dict[str, Any] = {}
    for _ in range(n_kv):
        key = string()
        fields[key] = value(u32())
    tokens = fields.get("tokenizer.ggml.tokens")
    tensors = []
    offsets: list[int] = []
    for _ in range(n_tensors):
        name, n_dims = string(), u32()
        if n_dims > GGML_MAX_DIMS:
            raise _Corrupt(f"tensor {name}: {n_dims} dimensions")
        dims = [u64() for _ in range(n_dims)]
        ttype, offset = u32(), u64()
        tensors.append((name, dims, ttype))
        offsets.append(offset)
    fields[_HEADER_END] = f.tell()
    fields[_OFFSETS] = offsets
    return fields, tokens.n if isinstance(tokens, _Array) else 0, tensors


@dataclass(frozen=True)
class _Array:
    n: int


def _tensor(gguf: Any, name: str, dims: list[int], ttype: int) -> Tensor:
    qtype = gguf.GGMLQuantizationType(ttype)
    block, type_size = gguf.GGML_QUANT_SIZES[qtype]
    n = 1
    for d in dims:
        n *= d
    if dims and dims[0] % block:
        raise _Corrupt(f"tensor {name}: row of {dims[0]} not a multiple of {block}")
    return Tensor(
        name=name,
        type=qtype.name,
        n_elements=n,
        n_bytes=n // block * type_size,
        rows=dims[1] if len(dims) > 1 else 1,
    )


def info_from_fields(
    path: str,
    *,
    size: int,
    fields: dict[str, Any],
    n_tokens: int,
    tensors: tuple[Tensor, ...],
    file_type: str | None,
    corrupt: Any = None,
) -> GgufInfo:
    """Build GgufInfo from decoded header fields (pure; unit-tested without files)."""

    def need(key: str) -> int:
        v = fields.get(key)
        if not isinstance(v, int) or v <= 0:
            why = f"key {key} missing or not a positive integer ({v!r})"
            raise corrupt(Path(path), why) if corrupt else ValueError(why)
        return v

    arch = fields.get("general.architecture")
    if not isinstance(arch, str) or not arch:
        why = "key general.architecture missing"
        raise corrupt(Path(path), why) if corrupt else ValueError(why)
    n_head = need(f"{arch}.attention.head_count")
    n_embd = need(f"{arch}.embedding_length")
    kv = fields.get(f"{arch}.attention.head_count_kv")
    n_head_kv = kv if isinstance(kv, int) and kv > 0 else n_head
    head_dim = n_embd // n_head
    key_len = fields.get(f"{arch}.attention.key_length")
    val_len = fields.get(f"{arch}.attention.value_length")
    vocab = fields.get(f"{arch}.vocab_size")
    swa = fields.get(f"{arch}.attention.sliding_window")
    recurrent = any(k.startswith((f"{arch}.ssm.", f"{arch}.wkv.")) for k in fields)
    return GgufInfo(
        path=path,
        file_bytes=size,
        architecture=arch,
        n_layer=need(f"{arch}.block_count"),
        n_embd=n_embd,
        n_head=n_head,
        n_head_kv=n_head_kv,
        n_ctx_train=need(f"{arch}.context_length"),
        vocab=vocab if isinstance(vocab, int) and vocab > 0 else n_tokens,
        key_length=key_len if isinstance(key_len, int) and key_len > 0 else head_dim,
        value_length=val_len if isinstance(val_len, int) and val_len > 0 else head_dim,
        file_type=file_type,
        tensors=tensors,
        sliding_window=swa if isinstance(swa, int) and swa > 0 else 0,
        recurrent=recurrent,
    )
