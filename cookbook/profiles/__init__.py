"""Cluster profiles as data: the built-in YAML files next to this module, the user's own
(``$XDG_CONFIG_HOME/cookbook/profiles/*.yaml``, default ``~/.config/cookbook/profiles/``) and the
project's (``./cookbook-profiles.yaml``, ``./.cookbook/profiles/*.yaml``).

A file maps profile names to profiles; a profile's keys are the fields of :class:`Profile` (the loader
reads them from the dataclass, so a new field is a new key), ``env`` maps variable names to a value or
to ``{value, source, expand}``, and ``extends: OTHER`` starts from another profile (mappings such as
``env`` are merged key by key, ``null`` drops an inherited key; every other key replaces the parent's).
A mistake (unknown key, wrong type, unknown ``extends``, a name defined twice) is one
:class:`ProfileError` line naming the file, the line and the key.

Everything reads profiles through :func:`profiles` (or :func:`get_profile`, which calls it).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import os
import re
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

BUILTIN_DIR = Path(__file__).parent
PROJECT_FILE = "cookbook-profiles.yaml"
PROJECT_DIR = Path(".cookbook") / "profiles"
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class ProfileError(ValueError):
    """A profile file that cannot be used, or an unknown profile: one line, ``FILE:LINE: ...``."""


@dataclass(frozen=True)
class EnvVar:
    """One environment variable a profile sets, with where its value comes from.

    ``expand``: the value is bash (e.g. ``${TMPDIR:-/tmp}/...``) evaluated on the node, not a literal.
    """

    name: str
    value: str
    source: str = ""
    expand: bool = False

    def __post_init__(self) -> None:
        if not _ENV_NAME.match(self.name):
            raise ValueError(f"{self.name!r} is not a variable name (letters, digits, _)")
        if _CONTROL.search(self.value) or _CONTROL.search(self.source):
            raise ValueError("value and source must be one line without control characters")


@dataclass(frozen=True)
class Threshold:
    """One pre-flight threshold and where its value comes from."""

    value: float
    source: str


@dataclass(frozen=True)
class Preflight:
    """The pre-flight gate's thresholds on one kind of cluster (``cookbook_runtime.run --gate-*`` switches: the
    runtime runs ``cookbook_runtime.nodecheck`` with them on every node before training; ``COOKBOOK_PREFLIGHT=0``
    skips it).

    ``matmul_fraction``: GPUs, the floor as a fraction of the GPU kind's dense bf16 peak (``cookbook/gpus.py``);
    ``matmul_min_tflops``: CPU, an absolute floor; ``max_retries``: how often a job excludes failing nodes and
    runs again (``COOKBOOK_MAX_RETRIES`` overrides it), for the gate, NODE_FAIL and hangs alike.
    """

    allreduce_min_busbw_gbps: Threshold
    min_free_disk_gb: Threshold
    time_limit_s: Threshold
    max_retries: Threshold
    matmul_fraction: Threshold | None = None
    matmul_min_tflops: Threshold | None = None
    allreduce_mb: int = 256  # all-reduce payload per rank (MiB): large enough to reach the bandwidth regime


@dataclass(frozen=True)
class Profile:
    """What one kind of cluster needs: backend, GPUs or not, its environment and network interface.

    ``interface``: ``"detect"`` sets ``NCCL_SOCKET_IFNAME``/``GLOO_SOCKET_IFNAME`` at run time to the
    interface holding the head node's address (names differ between sites and images: eth0, ens*, enp*,
    bond0); a pinned value is written as it is; None leaves NCCL's own choice.

    ``gpu``: the GPU kind (a key of :data:`cookbook.gpus.GPU_KINDS`) costs and forecasts assume when the user
    names none; ``price_per_gpu_hour``: the site's price (None: ``gpu``'s list price in :mod:`cookbook.gpus`);
    ``fabric``: the inter-node network NCCL should use (``"ib"``, ``"efa"``; None: TCP is all there is).
    ``preflight``: the pre-flight gate's thresholds (:class:`Preflight`), each with its source.
    ``shims``: the module every framework launch runs through (``torchrun -m SHIMS ENTRY ARGS``: the local bench's
    CPU shims, ``cookbook/local/compat/cpu.py``); the jobs then train the small models of the assets in
    ``$TINY_DIR``. None: the frameworks' own entry points, the recipes' real models.
    """

    name: str
    description: str
    backend: Literal["nccl", "gloo"]
    env: tuple[EnvVar, ...]
    uses_gpus: bool = True
    interface: str | None = None
    interface_source: str = ""
    gpu: str | None = None
    price_per_gpu_hour: float | None = None
    fabric: Literal["ib", "efa"] | None = None
    preflight: Preflight | None = None  # None: the built-in ``generic`` profile's (see :meth:`gate`)
    shims: str | None = None

    def gate(self) -> Preflight:
        """The pre-flight thresholds: the profile's own, else those of the built-in ``generic`` profile."""
        if self.preflight is not None:
            return self.preflight
        generic = profiles(builtin_only=True)["generic"].preflight
        assert generic is not None, "builtin.yaml: the generic profile sets preflight"
        return generic

    def __post_init__(self) -> None:
        from cookbook.gpus import GPU_KINDS

        if self.gpu is not None and self.gpu not in GPU_KINDS:
            kinds = ", ".join(GPU_KINDS)
            raise ValueError(f"gpu {self.gpu!r} is not a GPU kind of cookbook/gpus.py: use one of {kinds}")
        if self.price_per_gpu_hour is not None and self.price_per_gpu_hour < 0:
            raise ValueError(f"price_per_gpu_hour={self.price_per_gpu_hour}: cannot be negative")
        for label, text in (("description", self.description), ("interface_source", self.interface_source)):
            if _CONTROL.search(text):
                raise ValueError(f"{label}: one line without control characters (it is a comment in the script)")
        if self.interface is not None and (not self.interface.strip() or _CONTROL.search(self.interface)):
            raise ValueError(f"interface={self.interface!r}: give an interface name, 'detect', or null")

    def gpu_hour_price(self, gpu: str | None = None) -> float | None:
        """Price per GPU-hour (per node-hour without GPUs): the profile's own, else the list price of
        ``gpu`` (default: the profile's kind); None when neither is known."""
        if self.price_per_gpu_hour is not None:
            return self.price_per_gpu_hour
        from cookbook.gpus import list_price_per_gpu_hour

        kind = gpu or self.gpu
        return list_price_per_gpu_hour(kind) if kind else None


@dataclass(frozen=True)
class Origin:
    """Where a profile is defined: its file and line, the profile it extends, built in or not."""

    file: Path
    line: int
    extends: str | None
    builtin: bool


# --- files ---------------------------------------------------------------------------------------------


def user_dir() -> Path:
    """``$XDG_CONFIG_HOME/cookbook/profiles`` (a relative XDG_CONFIG_HOME is ignored, as the spec says)."""
    xdg = os.environ.get("XDG_CONFIG_HOME", "")
    base = Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".config"
    return base / "cookbook" / "profiles"


def _yaml_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.glob("*.y*ml") if p.suffix in (".yaml", ".yml") and p.is_file())


def profile_files(builtin_only: bool = False) -> list[tuple[Path, bool]]:
    """Every profile file read, in order, each with whether it is built in."""
    files = [(p, True) for p in _yaml_files(BUILTIN_DIR)]
    if not builtin_only:
        cwd = Path.cwd()
        local = [cwd / PROJECT_FILE] if (cwd / PROJECT_FILE).is_file() else []
        files += [(p, False) for p in [*_yaml_files(user_dir()), *local, *_yaml_files(cwd / PROJECT_DIR)]]
    return files


def profiles(builtin_only: bool = False) -> dict[str, Profile]:
    """Every profile by name: the built-in ones first, then the user's and the project's (``builtin_only``:
    those shipped with the package, e.g. for ``slurm-recipes/``). Raises :class:`ProfileError`."""
    return _load(_stamp(builtin_only))[0]


def get_profile(name: str) -> Profile:
    """The profile called ``name``; :class:`ProfileError` (one line) when there is none."""
    known = profiles()
    if name not in known:
        raise ProfileError(f"unknown profile {name!r}{_did_you_mean(name, known)}: use one of {', '.join(known)}")
    return known[name]


def origins(builtin_only: bool = False) -> dict[str, Origin]:
    """Where each profile of :func:`profiles` is defined."""
    return _load(_stamp(builtin_only))[1]


def _stamp(builtin_only: bool) -> tuple[tuple[str, int, int, bool], ...]:
    out = []
    for path, builtin in profile_files(builtin_only):
        st = path.stat()
        out.append((str(path), st.st_mtime_ns, st.st_size, builtin))
    return tuple(out)


# --- YAML with lines -----------------------------------------------------------------------------------


@dataclass
class _Node:
    """A YAML value with where it was written (the line of its key, for a mapping's values)."""

    value: Any  # a scalar, dict[str, _Node] or list[_Node]
    file: Path
    line: int

    def at(self) -> str:
        return f"{self.file}:{self.line}"


def _build(node: yaml.Node, file: Path, line: int, loader: yaml.SafeLoader) -> _Node:
    if isinstance(node, yaml.MappingNode):
        out: dict[str, _Node] = {}
        for k, v in node.value:
            key_line = k.start_mark.line + 1
            key = loader.construct_object(k)
            if not isinstance(key, str):
                raise ProfileError(f"{file}:{key_line}: key {key!r} is not a name")
            if key in out:
                raise ProfileError(f"{file}:{key_line}: {key!r} given twice (first on line {out[key].line})")
            out[key] = _build(v, file, key_line, loader)
        return _Node(out, file, line)
    if isinstance(node, yaml.SequenceNode):
        return _Node([_build(v, file, v.start_mark.line + 1, loader) for v in node.value], file, line)
    return _Node(loader.construct_object(node), file, line)


def _read(path: Path) -> _Node:
    text = path.read_text()
    try:
        loader = yaml.SafeLoader(text)
        try:
            root = loader.get_single_node()
            node = _build(root, path, 1, loader) if root is not None else _Node({}, path, 1)
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = mark.line + 1 if mark else 1
        raise ProfileError(f"{path}:{line}: not valid YAML: {e.problem or e.context}") from None
    if not isinstance(node.value, dict):
        raise ProfileError(f"{path}:1: expected a mapping of profile names to profiles")
    return node


# --- typed conversion, generic over the dataclass's fields ---------------------------------------------


class _Bad(Exception):
    def __init__(self, node: _Node, key: str, message: str):
        super().__init__(f"{key}: {message}")
        self.at = node.at()


def _did_you_mean(word: str, options: typing.Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(options), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _kind(value: Any) -> str:
    return "a mapping" if isinstance(value, dict) else "a list" if isinstance(value, list) else repr(value)


def _keyed(tp: Any) -> bool:
    """A dataclass whose first field is ``name``: written as a mapping ``name -> body``."""
    return dataclasses.is_dataclass(tp) and dataclasses.fields(tp)[0].name == "name"


def _convert(node: _Node, tp: Any, key: str) -> Any:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    value = node.value
    if tp is Any:
        return _plain(node)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        options = [a for a in args if a is not type(None)]
        errors = []
        for option in options:
            try:
                return _convert(node, option, key)
            except _Bad as e:
                errors.append(e)
        raise errors[0]
    if origin is Literal:
        if value in args:
            return value
        raise _Bad(node, key, f"got {_kind(value)}: use one of {', '.join(map(str, args))}")
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise _Bad(node, key, f"expected true or false, got {_kind(value)}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise _Bad(node, key, f"expected a whole number, got {_kind(value)}")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise _Bad(node, key, f"expected a number, got {_kind(value)}")
    if tp is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)  # NCCL_IB_TIMEOUT: 22
        raise _Bad(node, key, f"expected text, got {_kind(value)}" + (" (quote it)" if isinstance(value, bool) else ""))
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return _dataclass(node, tp, key)
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis and _keyed(args[0]):
        if not isinstance(value, dict):
            raise _Bad(node, key, f"expected a mapping of names to values, got {_kind(value)}")
        return tuple(_keyed_item(v, args[0], name, f"{key}.{name}") for name, v in value.items())
    if origin in (tuple, list):
        if not isinstance(value, list):
            raise _Bad(node, key, f"expected a list, got {_kind(value)}")
        item = args[0] if args else Any
        items = [_convert(v, item, f"{key}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        if not isinstance(value, dict):
            raise _Bad(node, key, f"expected a mapping, got {_kind(value)}")
        return {k: _convert(v, args[1] if args else Any, f"{key}.{k}") for k, v in value.items()}
    raise _Bad(node, key, f"the loader cannot read a field of type {tp!r}")  # a new field's type: extend _convert


def _keyed_item(node: _Node, tp: type, name: str, key: str) -> Any:
    """``NAME: value`` or ``NAME: {field: ...}`` of a keyed dataclass (the first field after ``name``)."""
    if not isinstance(node.value, dict):
        first = next(f.name for f in dataclasses.fields(tp)[1:])
        node = _Node({first: node}, node.file, node.line)
    return _dataclass(node, tp, key, fixed={"name": name})


def _dataclass(node: _Node, tp: type, key: str, fixed: dict[str, Any] | None = None) -> Any:
    fixed = fixed or {}
    if not isinstance(node.value, dict):
        raise _Bad(node, key, f"expected a mapping, got {_kind(node.value)}")
    hints = typing.get_type_hints(tp)
    fields = {f.name: f for f in dataclasses.fields(tp) if f.init and f.name not in fixed}
    kwargs: dict[str, Any] = dict(fixed)
    for name, child in node.value.items():
        where = f"{key}.{name}" if key else name
        if name not in fields:
            raise _Bad(child, where, f"unknown key{_did_you_mean(name, fields)}; known: {', '.join(fields)}")
        kwargs[name] = _convert(child, hints[name], where)
    missing = [
        n
        for n, f in fields.items()
        if n not in kwargs and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise _Bad(node, key or "profile", f"missing {', '.join(missing)}")
    try:
        return tp(**kwargs)
    except ValueError as e:
        raise _Bad(node, key or "profile", str(e)) from None


def _plain(node: _Node) -> Any:
    if isinstance(node.value, dict):
        return {k: _plain(v) for k, v in node.value.items()}
    if isinstance(node.value, list):
        return [_plain(v) for v in node.value]
    return node.value


def _merge(parent: _Node, child: _Node, top: bool) -> _Node:
    """``child`` over ``parent``: mappings key by key (``null`` drops an inherited key below the top level)."""
    if not (isinstance(parent.value, dict) and isinstance(child.value, dict)):
        return child
    out = dict(parent.value)
    for k, v in child.value.items():
        if v.value is None and not top:
            out.pop(k, None)
        else:
            out[k] = _merge(out[k], v, False) if k in out else v
    return _Node(out, child.file, child.line)


# --- loading -------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=8)
def _load(stamp: tuple[tuple[str, int, int, bool], ...]) -> tuple[dict[str, Profile], dict[str, Origin]]:
    raw: dict[str, tuple[_Node, bool]] = {}
    for path_text, _, _, builtin in stamp:
        for name, body in _read(Path(path_text)).value.items():
            if name in raw:
                first = raw[name][0]
                raise ProfileError(
                    f"{body.at()}: profile {name!r} is already defined at {first.at()}: "
                    f"pick another name and write `extends: {name}`"
                )
            if not isinstance(body.value, dict):
                got = _kind(body.value)
                raise ProfileError(f"{body.at()}: profile {name!r}: expected a mapping of keys, got {got}")
            raw[name] = (body, builtin)
    resolved: dict[str, _Node] = {}

    def resolve(name: str, chain: tuple[str, ...]) -> _Node:
        if name in resolved:
            return resolved[name]
        body = raw[name][0]
        ext = body.value.get("extends")
        rest = _Node({k: v for k, v in body.value.items() if k != "extends"}, body.file, body.line)
        if ext is None:
            resolved[name] = rest
            return rest
        if not isinstance(ext.value, str) or ext.value not in raw:
            raise ProfileError(
                f"{ext.at()}: profile {name!r}: extends: unknown profile {ext.value!r}"
                f"{_did_you_mean(str(ext.value), raw)}; known: {', '.join(raw)}"
            )
        if ext.value in (*chain, name):
            loop = " -> ".join((*chain, name, ext.value))
            raise ProfileError(f"{ext.at()}: profile {name!r}: extends: {loop} is a loop")
        resolved[name] = _merge(resolve(ext.value, (*chain, name)), rest, True)
        return resolved[name]

    out: dict[str, Profile] = {}
    where: dict[str, Origin] = {}
    for name, (body, builtin) in raw.items():
        node = resolve(name, ())
        try:
            out[name] = _dataclass(node, Profile, "", fixed={"name": name})
        except _Bad as e:
            raise ProfileError(f"{e.at}: profile {name!r}: {e}") from None
        ext = body.value.get("extends")
        where[name] = Origin(body.file, body.line, ext.value if ext else None, builtin)
    return out, where


def to_data(profile: Profile) -> dict[str, Any]:
    """``profile`` as a profile file writes it (every field, env as ``NAME: {value, source[, expand]}``)."""

    def plain(value: Any, tp: Any) -> Any:
        args = typing.get_args(tp)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            hints = typing.get_type_hints(type(value))
            return {f.name: plain(getattr(value, f.name), hints[f.name]) for f in dataclasses.fields(value)}
        if isinstance(value, tuple) and args and _keyed(args[0]):
            out = {}
            for item in value:
                body = plain(item, args[0])
                name = body.pop("name")
                out[name] = {k: v for k, v in body.items() if not (k == "expand" and v is False)}
            return out
        if isinstance(value, (tuple, list)):
            return [plain(v, args[0] if args else Any) for v in value]
        return value

    data = plain(profile, Profile)
    data.pop("name")
    return typing.cast(dict[str, Any], data)
