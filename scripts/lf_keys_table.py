"""Write docs/configuration.md's table of LLaMA-Factory keys from the config schema (so it cannot drift).

    python scripts/lf_keys_table.py          # rewrite the table in docs/configuration.md
    python scripts/lf_keys_table.py --check  # exit 1 if docs/configuration.md's table is not current

Rows: every key of cockpit/config/schema.py that comes from LLaMA-Factory or shares a name with one of
its keys (tests/fixtures/llamafactory/lf_keys.json) (works, with its help text), then every
LLaMA-Factory key Cockpit refuses, with the reason (cockpit/config/parity.py); a column per stage says whether its recipe honours the key (cockpit/config/stages.py's STAGES: a stage
refuses a key it does not honour at ``cockpit check``, naming the key and the stage).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

LF_KEYS = ROOT / "tests" / "fixtures" / "llamafactory" / "lf_keys.json"
START, END = "<!-- lf-keys:start (scripts/lf_keys_table.py) -->", "<!-- lf-keys:end -->"


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def table() -> str:
    from cockpit.config.parity import refusal_reason
    from cockpit.config.schema import ALIASES, KEYS, LLAMAFACTORY_UNSUPPORTED, describe
    from cockpit.config.stages import STAGES

    def stages(key: str) -> str:  # a column per stage, from its recipe's declared capabilities
        return " | ".join("yes" if caps.honours(key) else "**no**" for caps in STAGES.values())

    rows = [
        "| key | Cockpit | " + " | ".join(STAGES) + " |",
        "|---|---|" + "---|" * len(STAGES),
    ]
    # LLaMA-Factory's keys (tests/fixtures/llamafactory/lf_keys.json, bench/lf_key_list.py) that are Cockpit's
    # own keys of the same name, listed beside the keys taken from LLaMA-Factory
    lf_names = set(json.loads(LF_KEYS.read_text(encoding="utf-8"))["keys"]) if LF_KEYS.exists() else set()
    for k in sorted((k for k in KEYS if k.llamafactory or k.name in lf_names), key=lambda k: k.name):
        rows.append(f"| `{k.name}` | works: {cell(k.help)} ({cell(describe(k))}) | {stages(k.name)} |")
    for alias, key in sorted(ALIASES.items()):
        rows.append(f"| `{alias}` | works: read as `{key}` | {stages(key)} |")
    refused = " | ".join("**no**" for _ in STAGES)
    for name in sorted(LLAMAFACTORY_UNSUPPORTED):
        rows.append(f"| `{name}` | refused: {cell(refusal_reason(name) or 'not supported yet')} | {refused} |")
    return "\n".join(rows)


def render(readme: str) -> str:
    head, _, rest = readme.partition(START)
    _, _, tail = rest.partition(END)
    return f"{head}{START}\n{table()}\n{END}{tail}"


def main(argv: list[str]) -> int:
    path = ROOT / "docs" / "configuration.md"
    text = path.read_text(encoding="utf-8")
    if START not in text or END not in text:
        print(f"docs/configuration.md has no {START} ... {END} block", file=sys.stderr)
        return 1
    new = render(text)
    if "--check" in argv:
        if new != text:
            print(
                "docs/configuration.md's LLaMA-Factory key table is stale: run python scripts/lf_keys_table.py",
                file=sys.stderr,
            )
            return 1
        return 0
    path.write_text(new, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
