"""``cockpit doctor CONFIG``: what that config needs from this machine (issue 62, item 6).

The tags (:func:`cockpit.doctor.relevance.config_tags`: GPUs, ROCm, several ranks, DeepSpeed, QLoRA,
NUMA binding) make the other checks fail where a missing piece would stop this config; this check lists
them and the optional packages the config's keys import in its ranks (:func:`cockpit.side_site.
needed_modules`: bitsandbytes, GaLore / APOLLO, the trackers), each missing one with the command that
installs it.
"""

from __future__ import annotations

from typing import Any

from cockpit import side_site
from cockpit.doctor.model import FAIL, PASS, SKIP, Check, Context

WORDS = {
    "gpu": "GPUs (torch for ROCm)",
    "multi_gpu": "several ranks (RCCL)",
    "deepspeed": "DeepSpeed",
    "numa": "numactl (numa_bind)",
}
EXTRAS = {"bitsandbytes": "qlora", "galore_torch": "lowrank", "apollo_torch": "lowrank"}


def install_command(module: str, ctx: Context) -> str:
    extra = EXTRAS.get(module, "trackers")
    side = f", or {side_site.install_command(ctx.env)}" if extra != "trackers" else ""
    return f"pip install 'cockpit-tune[{extra}]'{side}"


def check_config(ctx: Context) -> Check:
    title = "what this config needs"
    if ctx.keys is None:
        return Check("config", title, SKIP, "no config given (cockpit doctor CONFIG checks for one)")
    from cockpit.doctor.relevance import config_tags

    tags = sorted(config_tags(ctx.keys))
    modules = side_site.needed_modules(ctx.keys)
    found = {m: side_site.installed_at(m, ctx.env) for m in modules}
    missing = [m for m, v in found.items() if v is None]
    needs = [WORDS[t] for t in WORDS if t in tags] + [side_site.DISTRIBUTIONS.get(m, m) for m in modules]
    data: dict[str, Any] = {"tags": tags, "modules": {m: (v[0] if v else None) for m, v in found.items()}}
    seen = "needs " + (", ".join(dict.fromkeys(needs)) if needs else "nothing beyond the CPU and the base install")
    if missing:
        fix = "\n".join(f"{m}: {install_command(m, ctx)}" for m in missing)
        return Check("config", title, FAIL, f"{seen}; not installed: {', '.join(missing)}", fix, data=data)
    return Check("config", title, PASS, seen + " (the other checks fail where a piece is missing)", data=data)
