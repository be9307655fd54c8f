"""Images in the data, read as LLaMA-Factory 0.9.5 reads them (issue 63). No torch imports.

A row's ``images`` column (``columns.images`` in dataset_info.json; sharegpt and alpaca alike) holds
one path or a list of paths. Each is looked up as LLaMA-Factory's ``DatasetConverter._find_medias``
does: ``os.path.join(media_dir, path)`` when that is a file (``media_dir`` defaults to ``dataset_dir``),
else the path as given; a relative path as given is read against the config's folder here (the ranks
work in the run dir), where LLaMA-Factory reads it against its working dir. The text marks where each
image goes with one ``<image>`` placeholder (LLaMA-Factory's ``IMAGE_PLACEHOLDER``); its
``mm_plugin._validate_messages`` refuses a row whose placeholders (system message apart) do not
match its images. Here a row is refused, by ``file:line``, before any run dir exists, for that, for an
image that is missing or cannot be decoded (Pillow opens and decodes it whole), and for a URL (no
network: images are read from local files). Video and audio columns are refused by name.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

from cockpit.data import mm_plugins
from cockpit.data.mm_plugins import PLUGINS

IMAGE_PLACEHOLDER = "<image>"
_URL = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*://|data:)")  # http(s)://, s3://, file://, a data: URI
IMAGE_COLUMN = "images"
OTHER_MEDIA_COLUMNS = ("videos", "audios")  # LLaMA-Factory's other multimodal columns: refused by name
# the templates whose images Cockpit trains (cockpit.data.mm_plugins, one entry each): name -> the text template
# whose slots it renders with (LLaMA-Factory's llava is vicuna's slots with the llava plugin)
IMAGE_TEMPLATES: dict[str, str] = {name: plugin.text_template for name, plugin in PLUGINS.items()}


def media_dir_of(media_dir: str | None, dataset_dir: str | None, registry_dir: Path | None, file: Path) -> Path:
    """Where a dataset's relative image paths are looked up first: ``media_dir`` when set, else
    ``dataset_dir`` (LLaMA-Factory's default), else the folder of the dataset_info.json that named the
    dataset, else the dataset file's folder (a bare file path, which LLaMA-Factory has no form of)."""
    for d in (media_dir, dataset_dir):
        if d:
            return Path(d)
    return registry_dir if registry_dir is not None else file.parent


def image_path(value: str, media_dir: Path, base_dir: Path) -> Path:
    """LLaMA-Factory's ``_find_medias`` for one path: under ``media_dir`` when a file is there, else as given."""
    joined = Path(os.path.join(media_dir, value))
    if joined.is_file():
        return joined
    given = Path(value).expanduser()
    return given if given.is_absolute() else base_dir / given


def _is_url(value: str) -> bool:
    return bool(_URL.match(value.strip()))


@lru_cache(maxsize=4096)
def _decoded(path: str, mtime_ns: int) -> tuple[int, int] | str:
    """(width, height) of the image file decoded whole, or why it cannot be (cached per file version)."""
    from PIL import Image

    try:
        with Image.open(path) as image:
            image.load()
            return image.size
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as exc:
        return f"{type(exc).__name__}: {exc}"


def read_images(value: Any, column: str, media_dir: Path, base_dir: Path) -> tuple[list[dict[str, Any]], str | None]:
    """The row's images as ``{"path": absolute path, "size": [width, height]}``, or the first problem."""
    if value in (None, "", []):
        return [], None
    items = value if isinstance(value, list) else [value]
    images: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        where = f"{column}[{i}]" if isinstance(value, list) else column
        if not isinstance(item, str) or not item.strip():
            return [], f"{where}: an image is a path (a non-empty string), got {type(item).__name__}"
        if _is_url(item):
            return [], (
                f"{where}: {item!r} is a URL; images are read from local files only (no network here): "
                "download it and give its path (relative to media_dir)"
            )
        path = image_path(item, media_dir, base_dir)
        if not path.is_file():
            return [], f"{where}: no such image {item!r} (looked in media_dir {media_dir}, then {path})"
        decoded = _decoded(str(path.resolve()), path.stat().st_mtime_ns)
        if isinstance(decoded, str):
            return [], f"{where}: cannot decode image {item!r} ({path}): {decoded}"
        images.append({"path": str(path.resolve()), "size": list(decoded)})
    return images, None


def placeholder_problem(messages: Sequence[Mapping[str, Any]], images: int, column: str) -> str | None:
    """LLaMA-Factory's count rule: one ``<image>`` in the turns (not the system message) per image."""
    marks = sum(str(m.get("content") or "").count(IMAGE_PLACEHOLDER) for m in messages if m.get("role") != "system")
    if marks == images:
        return None
    return (
        f"{marks} {IMAGE_PLACEHOLDER} placeholder(s) in the text but {images} image(s) in column {column!r}: "
        f"each image needs one {IMAGE_PLACEHOLDER} where it goes in a turn (LLaMA-Factory refuses the row too)"
    )


def _named(rec: Any, columns: Mapping[str, str], kinds: Sequence[str]) -> tuple[str, str] | None:
    """The first of ``kinds`` (images / videos / audios) the row fills: (kind, its column)."""
    if not isinstance(rec, dict):
        return None
    for kind in kinds:
        col = columns.get(kind, kind)
        if rec.get(col) not in (None, "", [], {}):
            return kind, col
    return None


def other_media_problem(rec: Any, columns: Mapping[str, str]) -> str | None:
    """A row that names videos / audios: not trained (images only so far), so a bad row, not a silent one."""
    named = _named(rec, columns, OTHER_MEDIA_COLUMNS)
    if named is None:
        return None
    kind, col = named
    return (
        f"the row names {kind} (column {col!r}): Cockpit trains images only, not video or audio; "
        f"drop the {col!r} field (or set allow_bad_rows: true to skip such rows)"
    )


IMAGE_STAGES = ("sft", "dpo")  # the stages whose rows may have images (LLaMA-Factory's supervised and pairwise)


def text_stage_problem(rec: Any, columns: Mapping[str, str], stage: str) -> str | None:
    """A row with images, videos or audios in a stage that trains text only (all but :data:`IMAGE_STAGES`)."""
    named = _named(rec, columns, (IMAGE_COLUMN, *OTHER_MEDIA_COLUMNS))
    if named is None:
        return None
    kind, col = named
    return (
        f"the row names {kind} (column {col!r}), but stage {stage} trains text only (images train with stage "
        f"{' or '.join(IMAGE_STAGES)}): it would train without them; drop the {col!r} field (or set "
        "allow_bad_rows: true to skip such rows)"
    )


def row_images(
    rec: Any, messages: Sequence[Mapping[str, Any]], columns: Mapping[str, str], media_dir: Path, base_dir: Path
) -> tuple[list[dict[str, Any]], str | None]:
    """A row's images and their placeholders checked (a row with no images and a dataset that declares no
    ``images`` column is a text row: its text is not searched for placeholders)."""
    err = other_media_problem(rec, columns)
    if err or not isinstance(rec, dict):
        return [], err
    column = columns.get("images", IMAGE_COLUMN)
    images, err = read_images(rec.get(column), column, media_dir, base_dir)
    if err:
        return [], err
    if images or "images" in columns:
        err = placeholder_problem(messages, len(images), column)
    return ([], err) if err else (images, None)


def template_problem(template: str | None) -> str | None:
    """Why rows with images cannot train with this config's template (None when they can)."""
    if template in IMAGE_TEMPLATES:
        return None
    known = ", ".join(sorted(IMAGE_TEMPLATES))
    return (
        f"the row has images, but template {template or '(unset)'!r} renders text only: images train with a "
        f"vision-language model and its template ({known}); drop the images column to train on the text"
    )


def expanded(messages: Sequence[Mapping[str, Any]], seqlen: int) -> list[dict[str, Any]]:
    """The messages with each ``<image>`` repeated ``seqlen`` times: a fixed count per image (LLaVA's
    ``LlavaPlugin.process_messages``). A count that varies by image: :func:`cockpit.data.mm_plugins.expanded`."""
    marks = sum(str(m.get("content") or "").count(IMAGE_PLACEHOLDER) for m in messages if m.get("role") != "system")
    return mm_plugins.expanded(messages, [IMAGE_PLACEHOLDER * seqlen] * marks)


def regularized(path: str, max_pixels: int, min_pixels: int) -> Any:
    """The image as LLaMA-Factory's base ``_preprocess_image`` hands it to the processor (LLaVA's plugin:
    ``image_max_pixels`` / ``image_min_pixels`` only); a plugin's own: :func:`cockpit.data.mm_plugins.regularized`."""
    return mm_plugins.regularized(PLUGINS["llava"], path, max_pixels, min_pixels)


def image_report(samples: Sequence[Mapping[str, Any]], seqlen: int | None = None) -> dict[str, Any] | None:
    """``cockpit check``'s image facts: rows with images, images, their sizes (smallest and largest by
    area), image tokens per image (min / p50 / max: they vary with the size for Qwen2-VL) and per row
    (they count against cutoff_len): each image's ``tokens`` (set by cockpit.data.prepare), else ``seqlen``
    for every image. None without images."""
    rows = [s["images"] for s in samples if s.get("images")]
    counts = [[int(i.get("tokens", seqlen or 0)) for i in r] for r in rows]
    if not rows or not all(all(r) for r in counts):
        return None
    sizes = sorted((tuple(i["size"]) for r in rows for i in r), key=lambda wh: wh[0] * wh[1])
    per_image = sorted(n for r in counts for n in r)
    per_row = sorted(sum(r) for r in counts)
    return {
        "rows": len(rows),
        "images": len(sizes),
        "smallest": list(sizes[0]),
        "largest": list(sizes[-1]),
        "tokens_per_image": {"min": per_image[0], "p50": per_image[len(per_image) // 2], "max": per_image[-1]},
        "image_tokens_per_row": {"p50": per_row[len(per_row) // 2], "max": per_row[-1]},
    }


def image_report_lines(report: Mapping[str, Any] | None) -> list[str]:
    """The report's lines for ``cockpit check`` (none without images)."""
    if not report:
        return []
    (sw, sh), (lw, lh), per_row = report["smallest"], report["largest"], report["image_tokens_per_row"]
    each = report["tokens_per_image"]
    tokens = (
        f"{each['min']} image tokens each"
        if each["min"] == each["max"]
        else f"image tokens per image min {each['min']} p50 {each['p50']} max {each['max']}"
    )
    return [
        f"images: {report['images']} in {report['rows']} rows, {sw}x{sh} to {lw}x{lh} px; "
        f"{tokens}; per row p50 {per_row['p50']} max {per_row['max']} (counted in cutoff_len)"
    ]
