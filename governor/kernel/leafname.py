"""A router model's name as the name of its leaf, ``<group>/models/<leaf>`` (issue 43 item 10).

The names come from a peer (llama-server's --alias of each child: a models directory's entries,
a preset's sections), so they are mapped, never trusted. :func:`leaf_name` is the one mapping,
pure; every reader and writer of a model's leaf goes through :func:`model_cgroup`:

- ``/`` separates cgroup path components, and llama.cpp's own preset example names models so
  (``[ggml-org/MY-MODEL-GGUF:Q8_0]``, a Hugging Face cache's ``user/repo:quant``): escaped as
  ``%2F``, and ``%`` itself as ``%25``, so the escaping is one-to-one and reads back
  (:func:`model_name`);
- the kernel's interface files sit beside the leaves in ``models/``: a leaf named
  ``memory.max`` fails with EEXIST, one named ``io.max`` would stop ``+io`` being enabled
  later (the file cannot be created). A name that starts with ``cgroup.`` or ``<controller>.``
  gets a ``_`` in front, and a name's own leading ``_`` is escaped (``%5F``): still one-to-one;
- control characters are refused (:class:`LeafNameError`): the kernel refuses ``\\n``
  (kernel/cgroup/cgroup.c cgroup_mkdir: "do not accept '\\n' to prevent making
  /proc/<pid>/cgroup unparsable"), the others break every line that shows a path; so are the
  empty name, ``.`` and ``..`` (no directory of their own);
- a leaf has at most NAME_MAX (255) bytes: a longer one is cut and ends in ``~`` and 8 hex
  digits of the name's sha256 (two names cut to the same start stay apart).

The leaves as the kernel holds them (issue 44 item 4): :func:`model_leaves` is the one listing
of ``<group>/models/*`` every reader takes (the live board's rows, the activity sampler); a
leaf stays after its model is unloaded; a process in it is a loaded model (a child that is
exiting still holds its memory): :func:`holds_process`.

Standard library only (the run time's import set).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from governor.errors import BackendError, PermissionDenied

if TYPE_CHECKING:
    from hashlib import sha256

    from governor.kernel.cgroupfs import CgroupFs
else:
    try:  # the builtin module: hashlib would map OpenSSL's libcrypto for 8 hex digits
        from _sha256 import sha256
    except ImportError:  # pragma: no cover - Pythons built without it
        from hashlib import sha256

MODELS = "models"  # <group>/models/<leaf>: the router's children (supervise/models.py)
NAME_MAX = 255  # bytes of one path component (include/uapi/linux/limits.h)
HASH_HEX = 8  # the suffix of a cut name: "~" + this many hex digits of its sha256
# the prefixes of the kernel's interface files in a cgroup: the core files (cgroup.*, and
# irq.pressure since 6.1) and each controller's (Documentation/admin-guide/cgroup-v2.rst;
# dmem since 6.14), whether or not the governor uses that controller
KERNEL_PREFIXES = frozenset(
    {"cgroup", "cpu", "cpuset", "io", "memory", "hugetlb", "pids", "rdma", "misc", "irq", "dmem"}
)
_ESCAPED = {"%": "%25", "/": "%2F"}
_UNESCAPED = {"25": "%", "2F": "/", "5F": "_"}
_PREFIX = "_"


class LeafNameError(ValueError):
    """A model name that names no leaf (a control character, empty, ``.`` or ``..``)."""


def refusal(model: str) -> str | None:
    """Why ``model`` names no leaf ("has a control character ('\\n')"); None when it does."""
    if model in ("", ".", ".."):
        return "names no directory"
    bad = next((c for c in model if ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0), None)
    if bad is not None:
        return f"has a control character ({bad!r})"
    return None


def leaf_name(model: str) -> str:
    """The leaf of ``model`` under ``<group>/models`` (module docstring); LeafNameError for a
    name that names none."""
    why = refusal(model)
    if why is not None:
        raise LeafNameError(f"model name {model[:40]!r} {why}")
    leaf = "".join(_ESCAPED.get(c, c) for c in model)
    if leaf.startswith(_PREFIX):
        leaf = "%5F" + leaf[1:]
    elif "." in model and model.split(".", 1)[0] in KERNEL_PREFIXES:
        leaf = _PREFIX + leaf
    raw = leaf.encode()
    if len(raw) <= NAME_MAX:
        return leaf
    suffix = "~" + sha256(model.encode()).hexdigest()[:HASH_HEX]
    cut = raw[: NAME_MAX - len(suffix)].decode("utf-8", "ignore")  # never half a character
    if "%" in cut[-2:]:
        cut = cut[: cut.rindex("%")]  # never half an escape
    return cut + suffix


def model_name(leaf: str) -> str | None:
    """The model a leaf of :func:`leaf_name` belongs to; None for a leaf that was cut (its
    name is the publisher's: RunState.router) or that no model maps to."""
    text = leaf[1:] if leaf.startswith(_PREFIX) else leaf
    out: list[str] = []
    i = 0
    while i < len(text):
        if text[i] == "%":
            code = text[i + 1 : i + 3]
            if code not in _UNESCAPED:
                return None
            out.append(_UNESCAPED[code])
            i += 3
            continue
        out.append(text[i])
        i += 1
    model = "".join(out)
    try:
        return model if leaf_name(model) == leaf else None  # the one leaf that maps back
    except LeafNameError:
        return None


def is_leaf(leaf: object) -> bool:
    """Whether ``leaf`` is a name :func:`leaf_name` can give: one path component of at most
    NAME_MAX bytes, no control character (a published mapping is checked so)."""
    return (
        isinstance(leaf, str)
        and refusal(leaf) is None
        and "/" not in leaf
        and len(leaf.encode("utf-8", "replace")) <= NAME_MAX
    )


def models_cgroup(group: str) -> str:
    """The parent of every model's leaf."""
    return f"{group}/{MODELS}"


def model_cgroup(group: str, model: str) -> str:
    """``<group>/models/<leaf>`` of ``model`` (LeafNameError: it has none)."""
    return f"{group}/{MODELS}/{leaf_name(model)}"


def model_leaves(fs: CgroupFs, group: str) -> list[tuple[str, str]]:
    """(cgroup, leaf name) of every model leaf under ``<group>/models``, sorted; none when
    ``models/`` is not there (no router, or no model placed yet) or cannot be listed."""
    try:
        cgroups = fs.children(models_cgroup(group))
    except (BackendError, PermissionDenied):
        return []
    return [(cg, cg.rsplit("/", 1)[1]) for cg in cgroups]


def holds_process(fs: CgroupFs, cgroup: str) -> bool | None:
    """Whether a process is in the leaf now (its model is loaded); None when the leaf went
    away meanwhile or cannot be read."""
    try:
        return bool(fs.procs(cgroup))
    except (BackendError, PermissionDenied):
        return None
