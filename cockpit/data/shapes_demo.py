"""The vision-language demo's data (issue 63, ``presets/cpu-vlm-demo.yaml``): coloured shapes (red / green /
blue x circle / square / triangle, random sizes, near the centre, the colours and background jittered), drawn with PIL by a
seeded generator, written as LLaMA-Factory's ``mllm_demo`` is laid out (sharegpt rows with ``images``,
``<image>`` in the user turn; the images relative to the dataset folder, its media_dir), and the held-out
image probes (drawn from another seed: never a training image) beside text control probes.

The files live in ``cockpit/demo_data`` (``@demo``), so ``cockpit check`` finds them as it finds the other
demo data; ``python -m cockpit.data.shapes_demo [FOLDER]`` writes them again, the same (a test compares).
Pure Python and PIL: no torch."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any

COLOURS = {"red": (215, 40, 40), "green": (40, 165, 60), "blue": (45, 75, 220)}
SHAPES = ("circle", "square", "triangle")
JITTER = 1  # px the shape's place moves from the centre
SIZE = 32  # px: the embedded VLM's image size (cockpit.models.embedded_vlm.IMAGE_SIZE)
QUESTIONS = (
    "<image>What is in this picture?",
    "<image>Describe the shape in the image.",
    "What do you see? <image>",
)
PROBE_QUESTION = "<image>What is in this picture?"
PER_CLASS = 120  # training rows per colour x shape (30 for 4 epochs: 72 % held out; more images, one pass: better)
PROBES_PER_CLASS = 2
TRAIN_SEED, PROBE_SEED = 63, 6300
DATA_FILE, PROBES_FILE, IMAGE_DIR = "shapes.jsonl", "shapes_probes.jsonl", "shapes"
CONTROL = (  # text control probes the embedded model answers under the preset's template and system prompt
    ("What is 2 + 2?", "4"),
    ("What is 3 + 5?", "8"),
    ("What is the opposite of hot?", "cold"),
    ("Which planet do we live on?", "Earth"),
    ("How do you say 'good morning' in French?", "bonjour"),
)


def draw(colour: str, shape: str, rng: random.Random) -> Any:
    """One SIZE x SIZE image: the shape in its colour (jittered) on a light background, near the centre."""
    from PIL import Image, ImageDraw

    background = tuple(rng.randint(225, 255) for _ in range(3))
    image = Image.new("RGB", (SIZE, SIZE), background)
    fill = tuple(max(0, min(255, c + rng.randint(-25, 25))) for c in COLOURS[colour])
    side = rng.randint(26, 30)
    x, y = (max(0, min(SIZE - side, (SIZE - side) // 2 + rng.randint(-JITTER, JITTER))) for _ in range(2))
    box = (x, y, x + side - 1, y + side - 1)
    pen = ImageDraw.Draw(image)
    if shape == "circle":
        pen.ellipse(box, fill=fill)
    elif shape == "square":
        pen.rectangle(box, fill=fill)
    else:
        pen.polygon([(x + side / 2, y), (x, y + side - 1), (x + side - 1, y + side - 1)], fill=fill)
    return image


def _classes() -> list[tuple[str, str]]:
    return [(c, s) for c in COLOURS for s in SHAPES]


def _row(image: str, question: str, colour: str, shape: str) -> dict[str, Any]:
    return {
        "messages": [
            {"role": "user", "content": question},
            {"role": "assistant", "content": f"A {colour} {shape}."},
        ],
        "images": [image],
    }


def write(folder: Path) -> list[Path]:
    """The training rows, their images and the probes into ``folder``; returns the files written."""
    written: list[Path] = []
    for part in ("train", "probe"):
        (folder / IMAGE_DIR / part).mkdir(parents=True, exist_ok=True)
    rng = random.Random(TRAIN_SEED)
    rows: list[dict[str, Any]] = []
    for i in range(PER_CLASS):
        for colour, shape in _classes():
            name = f"{IMAGE_DIR}/train/{len(rows):04d}-{colour}-{shape}.png"
            draw(colour, shape, rng).save(folder / name)
            written.append(folder / name)
            rows.append(_row(name, QUESTIONS[(i + len(rows)) % len(QUESTIONS)], colour, shape))
    rng.shuffle(rows)
    probes: list[dict[str, Any]] = []
    prng = random.Random(PROBE_SEED)
    for _ in range(PROBES_PER_CLASS):
        for colour, shape in _classes():
            name = f"{IMAGE_DIR}/probe/{len(probes):02d}-{colour}-{shape}.png"
            draw(colour, shape, prng).save(folder / name)
            written.append(folder / name)
            probes.append({"prompt": PROBE_QUESTION, "image": name, "expect": [colour, shape], "set": "image"})
    probes += [{"prompt": q, "expect": a, "set": "control"} for q, a in CONTROL]
    for file, records in ((DATA_FILE, rows), (PROBES_FILE, probes)):
        (folder / file).write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
        written.append(folder / file)
    return written


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    folder = Path(args[0]) if args else Path(__file__).resolve().parent.parent / "demo_data"
    files = write(folder)
    print(f"wrote {len(files)} files into {folder}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
