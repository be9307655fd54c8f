"""The doctor's data: a check result, the roots it reads, and the context checks run in.

No torch here: torch facts come from :mod:`cockpit.doctor.facts`, imported lazily.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1

PASS = "pass"
WARN = "warn"
FAIL = "fail"
SKIP = "skip"
STATUSES = (PASS, WARN, FAIL, SKIP)

# What a check can matter for. The launch code passes the tags of a config; a failure blocks
# that config when its matters_for meets the tags (or is empty: it matters for every config).
TAGS = frozenset(
    {
        "gpu",  # any training on a GPU
        "rocm",  # a ROCm (HIP) GPU
        "cuda",  # an NVIDIA GPU
        "multi_gpu",  # more than one rank: RCCL/NCCL, process-group bootstrap
        "deepspeed",  # DeepSpeed ZeRO / its ops
        "qlora",  # 4-bit bitsandbytes
        "numa",  # CPU/memory placement of the ranks
        "build",  # compiling extensions here (DeepSpeed JIT ops, bitsandbytes or flash-attn from source)
        "telemetry",  # GPU power/temperature/memory sampling in the supervisor
    }
)


@dataclass
class Check:
    """One check's result. ``to_dict`` is the stable JSON form (see the package docstring)."""

    id: str
    title: str
    status: str
    seen: str
    fix: str = ""
    matters_for: frozenset[str] = frozenset()
    data: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"bad status {self.status!r}")
        self.matters_for = frozenset(self.matters_for)

    def to_dict(self) -> dict[str, Any]:
        return {
            "v": SCHEMA_VERSION,
            "id": self.id,
            "title": self.title,
            "status": self.status,
            "seen": self.seen,
            "fix": self.fix,
            "matters_for": sorted(self.matters_for),
            "data": self.data,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Check:
        return cls(
            id=str(d["id"]),
            title=str(d.get("title", d["id"])),
            status=str(d["status"]),
            seen=str(d.get("seen", "")),
            fix=str(d.get("fix", "")),
            matters_for=frozenset(d.get("matters_for", ())),
            data=dict(d.get("data", {})),
        )


@dataclass(frozen=True)
class Roots:
    """Where the checks look. Tests point these at fake trees in a temp dir."""

    rocm: Path = Path("/opt/rocm")
    sys: Path = Path("/sys")
    proc: Path = Path("/proc")
    dev: Path = Path("/dev")
    runs_dir: Path | None = None  # None: cockpit.store.rundir.default_runs_dir()
    cache_dir: Path | None = None  # None: cockpit.store.rundir.cache_dir()
    ld_cache: bool = True  # also ask the system's `ldconfig -p` for libraries (tests: False)

    @classmethod
    def from_env(cls, env: Mapping[str, str], **overrides: Any) -> Roots:
        rocm = env.get("ROCM_PATH") or env.get("ROCM_HOME") or "/opt/rocm"
        base = cls(rocm=Path(rocm))
        clean: dict[str, Any] = {
            k: v if isinstance(v, bool) else Path(v) for k, v in overrides.items() if v is not None
        }
        return replace(base, **clean)


class Context:
    """What every check gets: the environment, the roots, the config's needs (and keys) and torch facts.

    ``needs``: tags the caller's config requires. A missing optional piece (DeepSpeed,
    bitsandbytes, a compiler, a GPU build of torch) is a *skip* or *warn* in general and a
    *fail* when the config needs it.
    """

    def __init__(
        self,
        env: Mapping[str, str],
        roots: Roots,
        needs: Iterable[str] = (),
        facts: Any = None,
        keys: Mapping[str, Any] | None = None,
    ):
        self.env = dict(env)
        self.roots = roots
        self.needs = frozenset(needs)
        self._facts = facts
        self.keys = keys  # `cockpit doctor CONFIG`: the config's schema keys (flat), else None

    @functools.cached_property
    def facts(self) -> Any:
        """:class:`cockpit.doctor.facts.TorchFacts` (imports torch on first use)."""
        if self._facts is not None:
            return self._facts
        from cockpit.doctor.facts import torch_facts

        return torch_facts()

    def severity(self, *tags: str, otherwise: str = WARN) -> str:
        """FAIL when the config needs one of ``tags``, else ``otherwise``."""
        return FAIL if self.needs.intersection(tags) else otherwise

    def which(self, name: str) -> str | None:
        return shutil.which(name, path=self.env.get("PATH", ""))

    def tool(self, name: str) -> str | None:
        """A ROCm tool: under the ROCm root's bin/ first, then on PATH."""
        candidate = self.roots.rocm / "bin" / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
        return self.which(name)

    def run(self, argv: list[str], timeout: float = 15.0, env: Mapping[str, str] | None = None) -> tuple[int, str]:
        """Run a helper program with this context's environment (or ``env``); (exit code, stdout+stderr).

        Never raises: a missing program or a timeout gives exit code 127 / 124 and a note.
        """
        try:
            proc = subprocess.run(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                errors="replace",
                timeout=timeout,
                env=dict(self.env if env is None else env),
            )
        except FileNotFoundError:
            return 127, f"{argv[0]}: not found"
        except subprocess.TimeoutExpired:
            return 124, f"{argv[0]}: no answer after {timeout:.0f} s"
        except OSError as exc:
            return 126, f"{argv[0]}: {exc}"
        return proc.returncode, proc.stdout


def read_text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return None


def version_tuple(text: str | None) -> tuple[int, ...]:
    """Leading numeric release of a version string: '6.3.42134-a9a8' -> (6, 3, 42134)."""
    if not text:
        return ()
    out: list[int] = []
    for part in text.strip().split("."):
        digits = ""
        for ch in part:
            if not ch.isdigit():
                break
            digits += ch
        if not digits:
            break
        out.append(int(digits))
        if len(digits) != len(part):
            break
    return tuple(out)


def version_at_least(version: str, minimum: str) -> bool:
    """PEP 440 comparison when ``packaging`` is there (0.49.2.dev0 < 0.49.2), else numeric."""
    try:
        from packaging.version import InvalidVersion, Version

        try:
            return Version(version) >= Version(minimum)
        except InvalidVersion:
            pass
    except ImportError:
        pass
    return version_tuple(version) >= version_tuple(minimum)


def gib(n_bytes: float) -> str:
    return f"{n_bytes / 2**30:.1f} GiB"
