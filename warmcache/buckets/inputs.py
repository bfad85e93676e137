"""Where observed lengths come from: a lengths file, a JSONL dataset, or the registry's misses.

Every reader refuses bad input with a one-line :class:`UsageError` that names the
file and line (or registry row) and the value at fault, and checks lengths
against the model's maximum where one is known, since a bucket longer than the
model's positions could never be compiled.
"""

from __future__ import annotations

import csv
import json
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from warmcache.buckets.distribution import LengthDistribution
from warmcache.errors import UsageError, first_line

#: Texts tokenised per call: big enough for the fast tokenizers' batching, small enough for steady progress.
TOKENIZE_CHUNK = 512


@dataclass(frozen=True, slots=True)
class Lengths:
    """Observed lengths and a short description of where they came from (for reports)."""

    distribution: LengthDistribution
    source: dict[str, Any]


@dataclass(frozen=True, slots=True)
class LengthLimit:
    """The longest length the model accepts, and where that number came from (named in errors)."""

    value: int
    origin: str


def read_lengths_file(path: str | Path, *, column: str | None = None, limit: LengthLimit | None = None) -> Lengths:
    """One length per line (blank lines and ``#`` comments skipped), or one CSV column with ``column``."""
    file = Path(path)
    rows = _csv_cells(file, column) if column is not None else _plain_lines(file)
    counts: Counter[int] = Counter()
    for where, text in rows:
        counts[_parse_length(where, text, limit)] += 1
    if not counts:
        raise UsageError(f"{file}: no lengths found (empty file)")
    source: dict[str, Any] = {"kind": "lengths", "path": str(file)}
    if column is not None:
        source["column"] = column
    return Lengths(LengthDistribution.from_counts(counts), source)


def read_dataset_lengths(
    path: str | Path,
    *,
    field: str,
    tokenizer_path: str,
    limit: LengthLimit | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> Lengths:
    """Token counts of ``field`` in each JSONL record, tokenised by the model's own tokenizer.

    Special tokens are included because the model sees them.
    ``progress(done, total)`` is called after each chunk of texts.
    """
    file = Path(path)
    texts = list(_jsonl_texts(file, field))
    if not texts:
        raise UsageError(f"{file}: no records found (empty file)")
    tokenizer = _load_tokenizer(tokenizer_path)
    counts: Counter[int] = Counter()
    for start in range(0, len(texts), TOKENIZE_CHUNK):
        chunk = texts[start : start + TOKENIZE_CHUNK]
        encoded = tokenizer([text for _, text in chunk], add_special_tokens=True)["input_ids"]
        for (line, _), ids in zip(chunk, encoded):
            counts[_checked(f"{file}:{line}", len(ids), limit, "tokens")] += 1
        if progress is not None:
            progress(start + len(chunk), len(texts))
    source: dict[str, Any] = {"kind": "dataset", "path": str(file), "field": field, "tokenizer": tokenizer_path}
    return Lengths(LengthDistribution.from_counts(counts), source)


def lengths_from_misses(
    summary: list[dict[str, Any]], *, registry: str, model: str, workload: str, limit: LengthLimit | None = None
) -> Lengths:
    """Recorded guard misses (``Registry.miss_summary``) of one model and workload, each length weighted by its count.

    A miss's ``seq_len`` is the length the guard saw for the whole request, i.e.
    already the longest row of a batched request.
    """
    counts: Counter[int] = Counter()
    for miss in summary:
        if miss["model"] != model or miss["workload"] != workload:
            continue
        where = f"{registry}: miss of model {model!r} batch={miss['batch_size']} seq={miss['seq_len']}"
        counts[_checked(where, int(miss["seq_len"]), limit, "tokens")] += int(miss["count"])
    if not counts:
        raise UsageError(f"{registry}: no recorded misses for model {model!r} (workload {workload})")
    return Lengths(
        LengthDistribution.from_counts(counts),
        {"kind": "misses", "registry": registry, "model": model, "workload": workload},
    )


def model_length_limit(model_path: str) -> LengthLimit | None:
    """``max_position_embeddings`` of the (text) config in ``model_path``, or None if it has none."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(model_path)
    except Exception:  # noqa: BLE001 - an unreadable config just has no limit to offer (transformers' checks raise anything)
        return None
    value = getattr(config.get_text_config(), "max_position_embeddings", None)
    if not isinstance(value, int) or value < 1:
        return None
    return LengthLimit(value, f"max_position_embeddings of {model_path}")


def _load_tokenizer(tokenizer_path: str) -> Any:
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(tokenizer_path)
    except (OSError, ValueError) as exc:
        raise UsageError(f"{tokenizer_path}: cannot load a tokenizer: {first_line(exc)}") from None


def _open_text(file: Path) -> Iterator[str]:
    try:
        with file.open(encoding="utf-8", newline="") as handle:
            yield from handle
    except FileNotFoundError:
        raise UsageError(f"{file}: file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{file}: cannot read: {exc}") from None


def _plain_lines(file: Path) -> Iterator[tuple[str, str]]:
    for number, line in enumerate(_open_text(file), start=1):
        text = line.strip()
        if text and not text.startswith("#"):
            yield f"{file}:{number}", text


def _csv_cells(file: Path, column: str) -> Iterator[tuple[str, str]]:
    reader = csv.DictReader(_open_text(file))
    if reader.fieldnames is None:
        return
    if column not in reader.fieldnames:
        raise UsageError(f"{file}: no column {column!r} (columns: {', '.join(reader.fieldnames)})")
    for row in reader:
        yield f"{file}:{reader.line_num} column {column!r}", (row.get(column) or "").strip()


def _jsonl_texts(file: Path, field: str) -> Iterator[tuple[int, str]]:
    for number, line in enumerate(_open_text(file), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UsageError(f"{file}:{number}: invalid JSON: {exc.msg}") from None
        if not isinstance(record, dict) or field not in record:
            keys = ", ".join(record) if isinstance(record, dict) else type(record).__name__
            raise UsageError(f"{file}:{number}: no field {field!r} (found: {keys})")
        if not isinstance(record[field], str):
            raise UsageError(f"{file}:{number}: field {field!r} must be a string, got {type(record[field]).__name__}")
        yield number, record[field]


def _parse_length(where: str, text: str, limit: LengthLimit | None) -> int:
    try:
        value = int(text)
    except ValueError:
        hint = " (a CSV file? pass --column NAME)" if "," in text else ""
        raise UsageError(f"{where}: not an integer: {text[:40]!r}{hint}") from None
    return _checked(where, value, limit, "")


def _checked(where: str, length: int, limit: LengthLimit | None, unit: str) -> int:
    shown = f"{length} {unit}".strip()
    if length < 1:
        raise UsageError(f"{where}: length must be >= 1, got {shown}")
    if limit is not None and length > limit.value:
        raise UsageError(f"{where}: length {shown} exceeds the model maximum {limit.value} ({limit.origin})")
    return length
