"""llama-server's router: the models it may load, each child's argv, and how many fit together.

A llama-server started without a model of its own and with ``--models-dir DIR`` and/or
``--models-preset FILE`` is a router (tools/server README "Using multiple models", the version
of notes/engine.md): it starts one child ``llama-server ... --alias NAME ... --model PATH`` per
model on demand and keeps at most ``--models-max`` (default 4, 0 = no limit) loaded, whatever
they weigh. Measured with that build (GET /models, each model's ``status.args``):

- a models directory lists each ``*.gguf`` file as the model named by its stem, and each
  subdirectory as the model named by the directory (its GGUF that is not an ``*mmproj*``
  projector; the first part of a split model), with that projector as its ``--mmproj``
  (common/preset.cpp load_from_models_dir);
- a preset is an INI file: one section a model (its name; ``model = PATH`` for one that is not
  in the directory), ``[*]`` for every model; keys are the options without dashes, short
  forms (``c``, ``np``) and ``LLAMA_ARG_*`` names included; flags take true/false;
- precedence: the router's command line, then the model's section, then ``[*]`` (a preset's
  ``c = 1024`` loses to the router's ``-c 256``); the children inherit the environment, which
  every option overrides;
- the router owns --host/--port/--alias/--model of the child; ``load-on-startup``,
  ``stop-timeout`` and ``dedup-cache-models`` are the preset's own keys (no option).

Each child's argv is built here in that precedence (the last word wins in
parse_llama_argv), so the one llama.cpp estimate sizes each model as the router will run it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from governor.engines import llama
from governor.kernel.leafname import leaf_name, refusal
from governor.peer.files import read_capped_text
from governor.plan import llama_args
from governor.plan.router import ROUTER_OWN_BYTES

if TYPE_CHECKING:
    from governor.engines.estimate import Estimate

MIB = 1 << 20
MODELS_MAX = 4  # --models-max default (common/arg.cpp); 0 = no limit
PRESET_MAX = 1 << 20  # a preset is a section a model: KiB (a file over it is not one)
# the preset's own keys: no llama-server option (tools/server README "Model presets")
PRESET_ONLY = frozenset(["version", "load-on-startup", "stop-timeout", "dedup-cache-models"])
# the router's own options, never passed to a child (it sets --host/--port/--alias/--model)
ROUTER_ONLY = frozenset(
    [
        *("--models-dir", "--models-preset", "--models-max", "--host", "--port"),
        *("-a", "--alias", "-m", "--model"),
    ]
)
ROUTER_FLAGS = frozenset(["--models-autoload", "--no-models-autoload"])
GLOBAL_SECTION = "*"
_TRUTHY, _FALSEY = llama_args.TRUTHY, llama_args.FALSEY
_SECTION_RE = re.compile(r"^\[(?P<name>[^\]]+)\]$")


def read_preset(path: Path) -> str:
    """The text of the preset at ``path``, read as a file another process may write
    (governor/peer/files.py): a FIFO, a device, a file over ``PRESET_MAX`` or one that is not
    UTF-8 is a CappedReadError (an OSError) naming it; FileNotFoundError passes."""
    return read_capped_text(path, PRESET_MAX)


class PresetError(ValueError):
    """A preset file the router would not read; ``line`` is 1-based."""

    def __init__(self, reason: str, *, line: int) -> None:
        super().__init__(f"{reason} (line {line})")
        self.reason = reason
        self.line = line


@dataclass(frozen=True)
class RouterModel:
    """One model the router may load: its name (the child's --alias), where it came from
    ("models_dir" or "preset") and the child's argv as the router builds it."""

    alias: str
    source: str
    argv: tuple[str, ...]


@dataclass(frozen=True)
class RouterEstimate:
    """Each model's estimate and how many of them fit together in ``budget``."""

    models: tuple[tuple[RouterModel, Estimate], ...]
    models_max: int  # as given (0 = no limit)
    budget: int | None = None
    budget_from: str = "memory.max"  # what the budget is: the policy's memory.max or --budget
    unsized: tuple[str, ...] = field(default_factory=tuple)  # models with no local file
    own: int = ROUTER_OWN_BYTES  # the router's own memory, beside its models (plan/router.py)

    @property
    def loadable(self) -> int:
        """How many models the router may hold loaded at once."""
        n = len(self.models)
        return n if self.models_max == 0 else min(self.models_max, n)

    @property
    def together(self) -> int | None:
        """How many fit the budget together, the largest first (None: no budget)."""
        if self.budget is None:
            return None
        return fits_together([e.total for _m, e in self.models], self.budget - self.own)

    @property
    def largest_bytes(self) -> int:
        """What the ``loadable`` largest models need together, with the router's own memory."""
        totals = sorted((e.total for _m, e in self.models), reverse=True)
        return self.own + sum(totals[: self.loadable])

    @property
    def fits(self) -> bool:
        together = self.together
        return together is None or together >= self.loadable

    def to_dict(self) -> dict[str, object]:
        return {
            "router": {
                "models_max": self.models_max,
                "loadable": self.loadable,
                "budget": self.budget,
                "fit_together": self.together,
                "largest_bytes": self.largest_bytes,
                "router_own": self.own,
                "fits": self.fits,
                "unsized": list(self.unsized),
            },
            "models": [
                {
                    "alias": m.alias,
                    "leaf": leaf_of(m.alias),
                    "source": m.source,
                    "argv": list(m.argv),
                    **e.to_dict(),
                }
                for m, e in self.models
            ],
        }


def leaf_of(alias: str) -> str | None:
    """The model's leaf under ``<group>/models`` (kernel/leafname.py); None: it has none."""
    return None if refusal(alias) is not None else leaf_name(alias)


def shown(alias: str) -> str:
    """A model's name as a table shows it: as it is, unless it has a control character."""
    return alias if refusal(alias) is None else repr(alias)


def name_warnings(rest: RouterEstimate) -> list[str]:
    """The models whose name maps to no leaf: the router runs them all the same, in the
    engine's leaf, without a limit of their own (issue 43 item 9)."""
    return [
        f"router model {shown(m.alias)} {refusal(m.alias)}: no leaf of its own, its child"
        " will run in the router's leaf without limits of its own"
        for m, _e in rest.models
        if refusal(m.alias) is not None
    ]


def fits_together(totals: Sequence[int], budget: int) -> int:
    """How many models fit ``budget`` at once in the worst case: the largest first."""
    used = n = 0
    for total in sorted(totals, reverse=True):
        if used + total > budget:
            break
        used += total
        n += 1
    return n


def parse_preset(text: str) -> dict[str, dict[str, str]]:
    """The preset's sections (``*`` included) as {name: {key: value}}, keys as written;
    keys before the first section (``version = 1``) are dropped. The last value of a key wins."""
    out: dict[str, dict[str, str]] = {}
    current: dict[str, str] | None = None
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line[0] in ";#":
            continue
        m = _SECTION_RE.match(line)
        if m:
            name = m["name"].strip()
            if not name:
                raise PresetError("a section has no name", line=n)
            current = out.setdefault(name, {})
            continue
        key, eq, value = line.partition("=")
        if not eq or not key.strip():
            raise PresetError(f"not a 'key = value' line: {line[:40]!r}", line=n)
        if current is not None:
            current[key.strip()] = value.strip()
    return out


def _option_of(key: str) -> tuple[str | None, str | None]:
    """(value option, flag option) a preset key names, in llama.cpp spelling."""
    if key.startswith("LLAMA_ARG_"):
        canon = llama_args.ENV_OPTS.get(key)
        if canon is not None:
            return next(o for o, c in llama_args.READ_OPTS.items() if c == canon), None
        flag = {"LLAMA_ARG_KV_UNIFIED": "--kv-unified", "LLAMA_ARG_REPACK": "--repack"}.get(key)
        return (None, flag) if flag is not None else (None, None)
    for word in (f"--{key}", f"-{key}"):
        if word in llama_args.READ_OPTS or word in llama_args.SKIP_VALUE_OPTS:
            return word, None
        if word in llama_args.UNSIZED_VALUE_OPTS:
            return word, None
        if word in llama_args.FLAG_OPTS or word in llama_args.UNSIZED_FLAGS:
            return None, word
    return f"--{key}", None  # an option this reader does not know: kept, never sized


def preset_model(section: Mapping[str, str]) -> str | None:
    """The model path a preset section names (``model``, ``m`` or ``LLAMA_ARG_MODEL``)."""
    found = None
    for key, value in section.items():
        if _option_of(key)[0] in ("-m", "--model"):
            found = value
    return found


def preset_words(section: Mapping[str, str]) -> list[str]:
    """One preset section as the argv words the router passes its child."""
    words: list[str] = []
    for key, value in section.items():
        if key in PRESET_ONLY:
            continue
        opt, flag = _option_of(key)
        if opt in ROUTER_ONLY:  # the router sets the child's --model, --alias, --host, --port
            continue
        if opt is not None:
            words += [opt, value]
            continue
        if flag is None:
            continue
        word = _flag_word(flag, value)
        if word is not None:
            words.append(word)
    return words


_SHORT_FLAGS = {"nr": "no-repack", "kvu": "kv-unified", "no-kvu": "no-kv-unified"}


def _flag_word(flag: str, value: str) -> str | None:
    """A boolean preset key as the flag llama-server reads (``repack = false`` is
    --no-repack); None for a value that is neither true nor false (common_arg_utils)."""
    if value.lower() not in _TRUTHY | _FALSEY:
        return None
    name = flag.lstrip("-")
    name = _SHORT_FLAGS.get(name, name)
    negated = name.startswith("no-")
    base = name[3:] if negated else name
    on = (value.lower() in _TRUTHY) != negated
    return f"--{base}" if on else f"--no-{base}"


def router_words(argv: Sequence[str]) -> list[str]:
    """The router's own command line without what it keeps to itself (the program dropped)."""
    out: list[str] = []
    for opt in llama_args.options(argv[1:]):
        if opt.name == "--":
            break
        if opt.name not in ROUTER_ONLY and opt.name not in ROUTER_FLAGS:
            out += opt.words
    return out


def _projector_file(name: str) -> bool:
    """A projector beside a model (common/preset.cpp is_mmproj_file: "mmproj" in the name)."""
    return "mmproj" in name


def dir_projectors(models_dir: Path) -> dict[str, Path]:
    """The projector of each subdirectory model of a --models-dir, by name: llama-server gives
    the child LLAMA_ARG_MMPROJ of its *mmproj*.gguf (common/preset.cpp load_from_models_dir,
    the last one listed); a top-level file model has none."""
    out: dict[str, Path] = {}
    for entry in sorted(models_dir.iterdir()):
        if entry.is_dir():
            found = sorted(
                p for p in entry.iterdir() if p.suffix == ".gguf" and _projector_file(p.name)
            )
            if found:
                out[entry.name] = found[-1]
    return out


def dir_models(models_dir: Path) -> dict[str, Path]:
    """The models of a --models-dir, by name: each *.gguf (its stem), each subdirectory (its
    GGUF that is not an *mmproj* projector, the first part of a split model), sorted."""
    out: dict[str, Path] = {}
    for entry in sorted(models_dir.iterdir()):
        if entry.is_file() and entry.suffix == ".gguf" and not _projector_file(entry.name):
            out[entry.stem] = entry
        elif entry.is_dir():
            ggufs = sorted(
                p for p in entry.iterdir() if p.suffix == ".gguf" and not _projector_file(p.name)
            )
            split = [p for p in ggufs if re.search(r"-00001-of-\d{5}\.gguf$", p.name)]
            if split or ggufs:
                out[entry.name] = (split or ggufs)[0]
    return out


def router_models(
    args: llama.EngineArgs, *, preset_text: str | None, cwd: Path
) -> tuple[list[RouterModel], list[str]]:
    """Every model the router may load with the child argv it builds, and the names of preset
    models with no local model file (a Hugging Face repo: not sized)."""
    program = args.argv[0] if args.argv else "llama-server"
    preset = parse_preset(preset_text) if preset_text is not None else {}
    common = preset.get(GLOBAL_SECTION, {})
    found: dict[str, tuple[str, str | None]] = {}
    projectors: dict[str, Path] = {}
    if args.models_dir is not None:
        base = Path(args.models_dir)
        base = base if base.is_absolute() else cwd / base
        for name, path in dir_models(base).items():
            found[name] = ("models_dir", str(path))
        projectors = dir_projectors(base)
    for name in preset:
        if name != GLOBAL_SECTION and name not in found:
            found[name] = ("preset", None)
    cli = router_words(args.argv)
    models: list[RouterModel] = []
    unsized: list[str] = []
    for name, (source, listed) in found.items():
        own = preset.get(name, {})
        words = [*preset_words(common), *preset_words(own)]
        if name in projectors:  # the directory's projector, under the preset's and the CLI's
            words = ["--mmproj", str(projectors[name]), *words]
        model = preset_model(own) or preset_model(common) or listed
        if model is None:
            unsized.append(name)
            continue
        if not Path(model).is_absolute():
            model = str(cwd / model)  # relative to the server's working directory
        argv = (program, *words, *cli, "--alias", name, "--model", model)
        models.append(RouterModel(alias=name, source=source, argv=argv))
    return models, unsized


def render(rest: RouterEstimate) -> str:
    """The table `governor estimate` prints for a router: a row per model, then the fit."""

    def mib(n: int) -> str:
        return f"{n / MIB:9.1f} MiB"

    width = max([5, *(len(shown(m.alias)) for m, _e in rest.models)])
    vision = any(e.settings.projector is not None for _m, e in rest.models)
    given = "no limit" if rest.models_max == 0 else str(rest.models_max)
    lines = [
        f"llama-server router: {len(rest.models)} models, --models-max {given}"
        f" ({rest.loadable} loaded at once)",
        f"  {'model':<{width}}  {'estimate':>13}  {'weights':>13}"
        + (f"  {'projector':>13}" if vision else "")
        + f"  {'-c':>6}  file",
    ]
    by_size = sorted(rest.models, key=lambda me: me[1].total, reverse=True)
    for m, e in by_size:
        lines.append(
            f"  {shown(m.alias):<{width}}  {mib(e.total)}  {mib(e.term('weights'))}"
            + (f"  {mib(e.term('projector') + e.term('image'))}" if vision else "")
            + f"  {e.settings.ctx:>6}  {shown(str(e.model))}"
        )
    lines.append(
        f"  the {rest.loadable} largest together, with the router's own {mib(rest.own).strip()}:"
        f" {mib(rest.largest_bytes).strip()}"
    )
    together = rest.together
    if rest.budget is not None and together is not None:
        verdict = (
            "fits"
            if rest.fits
            else f"does NOT fit: {together} fit together (largest first);"
            f" pass --models-max {together}"
            if together
            else "does NOT fit: no model fits alone"
        )
        lines.append(f"  budget {mib(rest.budget).strip()} ({rest.budget_from}): {verdict}")
        lines.append(f"  fit together in the budget, largest first: {together}")
    lines += [
        f"  leaf of {m.alias}: models/{leaf}"
        for m, _e in by_size
        if (leaf := leaf_of(m.alias)) is not None and leaf != m.alias
    ]
    lines += [f"  warning: {shown(name)}: no local model file, not sized" for name in rest.unsized]
    lines += [f"  warning: {w}" for w in name_warnings(rest)]
    for m, e in by_size:
        lines += [f"  warning: {shown(m.alias)}: {w}" for w in e.warnings]
    return "\n".join(lines) + "\n"
