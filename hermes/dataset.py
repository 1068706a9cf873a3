"""The prompt dataset reader: one :class:`PromptRow` (or :class:`BadRow`) per position.

Use :class:`PromptSource` to turn a :class:`DatasetSpec` into the rows a job runs. Rows
come out in their final order (after the seeded shuffle and ``max_samples``); the runner
shards on positions in that order, and a bad row keeps its position so shard boundaries
never move.

How each format is read (memory stays flat: nothing holds all rows in Python lists):

- **JSONL** (``.jsonl``/``.ndjson``, or ``.json`` not starting with ``[``): validated line
  by line with the standard library, because the ``datasets`` JSON loader fails on the
  whole file for one bad line or for a field whose type differs between lines. A blank
  line is skipped; a line that is not UTF-8, not JSON, not an object, or holds an unpaired
  surrogate escape is rejected (``bad_rows_before_load``: the first 1,000 plus a count)
  and is not a position. Every accepted line is kept verbatim, with its row index and
  line number, in an Arrow file in the cache dir, which ``datasets.Dataset.from_file``
  memory-maps. Rows are parsed again as they are iterated, so a column may hold an int
  in one line and a string in the next: the reader never types columns across rows.
- **JSON array** (``.json`` starting with ``[``): parsed whole (as ``datasets`` does;
  use JSONL for large data), then stored like JSONL; a non-object element is rejected.
- **Parquet**, **CSV**: ``datasets.load_dataset`` with a private ``cache_dir``. CSV
  columns are all read as strings, so values are not retyped (``007`` stays ``007``)
  and mixed columns cannot fail the load.
- **save_to_disk directory**: ``datasets.load_from_disk`` (a ``DatasetDict`` by ``split``).
- **hub name** (a path that does not exist and looks like ``org/name``, or
  ``format="hub"``): ``datasets.load_dataset(name, split=...)``.

Row index: the row's number in the original dataset (for JSONL, the count of non-blank
lines before it; for a JSON array, its position). Without an id column the prompt id is
``row-{index:09d}``, so identical prompts at different rows are different prompts.

Ids: when any row has the id column, every row needs a non-blank id there (else it is a
bad row); ids compare as text, so ``1`` and ``"1"`` are the same id. Duplicate ids are
found once, when the source opens, by sorting (id, row index) pairs
with pyarrow: about 50 bytes plus the id's length per row while sorting (given back to
the OS afterwards), then 16 bytes per duplicate found; no Python set of ids is kept.
The first row (lowest index) with an id wins; later ones are bad rows. The shuffle keeps
a permutation of row indices (8 bytes per row, numpy ``default_rng(seed)``).

Caches: a file's sha256 (for :meth:`PromptSource.fingerprint`) and a validated JSON
file are reused while the file's size, mtime and inode are unchanged, except for a file
modified in the last 2 s, which may change again within the same mtime tick.

``metadata`` is the row's other columns as ``json.dumps(sort_keys=True)`` text; values
JSON has no type for are written as: dates and times as ISO 8601 strings, bytes as base64
strings, anything else (decimals, ...) as ``str(value)``.
"""

from __future__ import annotations

import base64
import codecs
import csv
import datetime as dt
import hashlib
import itertools
import json
import logging
import os
import re
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from hermes.errors import DatasetError

logger = logging.getLogger(__name__)

FORMATS = ("auto", "jsonl", "json", "parquet", "csv", "disk", "hub")
_SUFFIXES = {
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "json",
    ".parquet": "parquet",
    ".pq": "parquet",
    ".csv": "csv",
}
_HUB_NAME = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")
_CACHE_VERSION = "hermes-dataset-1"  # bump when the cached record layout changes
_READ_ROWS = 1024  # rows converted to Python at a time while iterating
_WRITE_ROWS = 8192  # records per Arrow batch in the cleaned JSONL file
_MAX_KEPT_BAD = 1000
_MAX_LOGGED_BAD = 20
_MAX_KEYS_LISTED = 50
# A file modified this recently may change again within the same mtime tick; like git's
# "racy clean" rule, results keyed by its stat are then not cached.
_RACY_WINDOW_S = 2.0
_RECORD_SCHEMA = pa.schema(
    [
        ("index", pa.int64()),
        ("line", pa.int64()),
        ("record", pa.large_string()),
        ("id", pa.string()),
    ]
)
_MISSING = object()


@dataclass(frozen=True, kw_only=True)
class DatasetSpec:
    """Where the prompts are and how to read them (the job config's ``dataset`` block)."""

    path: str
    format: str = "auto"
    split: str = "train"  # for hub datasets and save_to_disk DatasetDicts; a file has one
    prompt_column: str = "prompt"
    id_column: str | None = "id"
    max_samples: int | None = None
    shuffle: bool = False
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.path:
            raise DatasetError("dataset.path is empty; set it to a file, directory or hub name")
        if self.format not in FORMATS:
            raise DatasetError(
                f"unknown dataset format {self.format!r}; use one of: {', '.join(FORMATS)}"
            )
        if not self.prompt_column:
            raise DatasetError("dataset.prompt_column is empty; name the prompt column")
        if self.id_column == "":
            raise DatasetError("dataset.id_column is empty; name a column or set it to null")
        if self.max_samples is not None and self.max_samples < 1:
            raise DatasetError(f"dataset.max_samples must be at least 1, got {self.max_samples}")
        if self.seed < 0:
            raise DatasetError(f"dataset.seed must be a non-negative integer, got {self.seed}")


@dataclass(frozen=True, kw_only=True)
class PromptRow:
    """A usable row: one agent episode."""

    prompt_id: str
    prompt_index: int  # row index in the original dataset (before shuffle/max_samples)
    prompt: str
    metadata: str  # the other columns, as JSON object text


@dataclass(frozen=True)
class BadRow:
    """A row that cannot become an episode; ``line`` is set for JSONL input."""

    index: int | None
    line: int | None
    reason: str


@dataclass
class _ScanReport:
    """What validating a JSON/JSONL file found; cached as JSON beside the cleaned file."""

    sha256: str = ""
    records: int = 0
    bad: list[BadRow] = field(default_factory=list)
    bad_count: int = 0
    prompt_seen: bool = False
    id_seen: bool = False
    keys: list[str] = field(default_factory=list)  # the first keys seen, for messages

    def reject(self, row: BadRow) -> None:
        self.bad_count += 1
        if len(self.bad) < _MAX_KEPT_BAD:
            self.bad.append(row)

    def accept(self, obj: Mapping[str, Any], spec: DatasetSpec) -> None:
        self.records += 1
        if not self.prompt_seen and spec.prompt_column in obj:
            self.prompt_seen = True
        if not self.id_seen and spec.id_column is not None and spec.id_column in obj:
            self.id_seen = True
        if len(self.keys) < _MAX_KEYS_LISTED:
            fresh = [key for key in obj if key not in self.keys]
            self.keys.extend(fresh[: _MAX_KEYS_LISTED - len(self.keys)])

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> _ScanReport:
        data = json.loads(text)
        data["bad"] = [BadRow(**row) for row in data["bad"]]
        return cls(**data)


class _RecordWriter:
    """Appends accepted records to an Arrow stream file, a bounded batch at a time."""

    def __init__(self, path: Path) -> None:
        self._sink = pa.OSFile(str(path), "wb")
        self._writer = pa.ipc.new_stream(self._sink, _RECORD_SCHEMA)
        self._index: list[int] = []
        self._line: list[int | None] = []
        self._text: list[str] = []
        self._id: list[str | None] = []

    def add(self, index: int, line: int | None, text: str, id_text: str | None) -> None:
        self._index.append(index)
        self._line.append(line)
        self._text.append(text)
        self._id.append(id_text)
        if len(self._index) >= _WRITE_ROWS:
            self._flush()

    def _flush(self) -> None:
        columns = (self._index, self._line, self._text, self._id)
        arrays = [pa.array(c, type=t) for c, t in zip(columns, _RECORD_SCHEMA.types, strict=True)]
        self._writer.write_batch(pa.record_batch(arrays, schema=_RECORD_SCHEMA))
        for column in columns:
            column.clear()

    def __enter__(self) -> _RecordWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            if exc[0] is None and self._index:
                self._flush()
            self._writer.close()
        finally:
            self._sink.close()


class PromptSource:
    """An opened, validated prompt dataset; iterate it with :meth:`iter_rows`.

    Raises DatasetError when the dataset cannot be read at all: missing file, unknown
    format, no prompt column, no rows. ``cache_dir`` (e.g. the run dir's ``.cache``)
    receives every file the reader or ``datasets`` writes.
    """

    def __init__(self, spec: DatasetSpec, *, cache_dir: Path) -> None:
        self.spec = spec
        self._cache_dir = Path(cache_dir)
        (self._cache_dir / "hermes").mkdir(parents=True, exist_ok=True)
        self.format, self._path = _resolve_format(spec)
        self.bad_rows_before_load: list[BadRow] = []
        self.bad_rows_before_load_count = 0
        self._digest: str | None = None
        self._records = self.format in ("jsonl", "json")
        if self._records:
            dataset, self._has_id = self._open_records()
        else:
            dataset, self._has_id = self._open_columns()
        if dataset.num_rows == 0:
            raise DatasetError(f"dataset {spec.path} has no rows")
        self._arrow = dataset.with_format("arrow")
        self._num_source_rows: int = dataset.num_rows
        self._source_fingerprint = str(getattr(dataset, "_fingerprint", ""))
        self._dup_rows, self._dup_first = self._find_duplicates()
        # The sort's buffers are freed but kept by Arrow's allocator; give them back so
        # the driver's footprint does not carry a per-row cost for the whole job.
        pa.default_memory_pool().release_unused()
        self._order = _permutation(self._num_source_rows, spec)
        self._len = min(self._num_source_rows, spec.max_samples or self._num_source_rows)
        if not self._has_id:
            logger.info("%s has no id column; prompt ids are row-<index>", spec.path)

    def __len__(self) -> int:
        """Positions :meth:`iter_rows` yields (bad rows included)."""
        return self._len

    def iter_rows(self, start: int = 0, stop: int | None = None) -> Iterator[PromptRow | BadRow]:
        """Rows at positions [start, stop) of the final order; skipping costs nothing."""
        if start < 0:
            raise ValueError(f"start must be >= 0, got {start}")
        end = self._len if stop is None else min(stop, self._len)
        for low in range(start, end, _READ_ROWS):
            high = min(low + _READ_ROWS, end)
            if self._order is None:
                rows: npt.NDArray[np.int64] = np.arange(low, high, dtype=np.int64)
                table = self._arrow[low:high]
            else:
                rows = self._order[low:high]
                # A gather returns one chunk per row; one chunk converts far faster.
                table = self._arrow[rows.tolist()].combine_chunks()
            yield from self._items(table, rows)

    def fingerprint(self) -> str:
        """A digest of the dataset's content and of every spec field that changes the rows.

        The path is left out on purpose: the same bytes moved elsewhere are the same
        dataset. A shuffle adds a digest of the permutation itself, so a numpy release
        that reorders it is detected too.
        """
        spec = self.spec
        parts: dict[str, Any] = {
            "version": _CACHE_VERSION,
            "format": self.format,
            "content": self._content_digest(),
            "rows": self._num_source_rows,
            "prompt_column": spec.prompt_column,
            "id_column": spec.id_column,
            "max_samples": spec.max_samples,
            "shuffle": spec.shuffle,
        }
        if self.format in ("disk", "hub"):
            parts["split"] = spec.split
        if self._order is not None:
            parts["seed"] = spec.seed
            parts["order"] = hashlib.sha256(self._order.tobytes()).hexdigest()
        return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()

    # -- opening ---------------------------------------------------------------------

    def _open_records(self) -> tuple[datasets.Dataset, bool]:
        assert self._path is not None
        dataset, report = _cleaned_records(self._path, self.format, self.spec, self._cache_dir)
        self._digest = report.sha256
        self.bad_rows_before_load = report.bad
        self.bad_rows_before_load_count = report.bad_count
        for row in report.bad[:_MAX_LOGGED_BAD]:
            logger.warning("%s %s: %s (skipped)", self.spec.path, _where(row), row.reason)
        if report.bad_count > _MAX_LOGGED_BAD:
            more = report.bad_count - _MAX_LOGGED_BAD
            logger.warning("%s: %d more bad entries (skipped)", self.spec.path, more)
        if report.records == 0:
            first = report.bad[0] if report.bad else None
            detail = f"; first: {_where(first)}: {first.reason}" if first else ""
            raise DatasetError(
                f"dataset {self.spec.path} has no rows ({report.bad_count} lines rejected{detail})"
            )
        if not report.prompt_seen:
            _raise_no_prompt_column(self.spec, report.keys)
        return dataset, report.id_seen

    def _open_columns(self) -> tuple[datasets.Dataset, bool]:
        dataset = _load_with_datasets(self.format, self._path, self.spec, self._cache_dir)
        if self.spec.prompt_column not in dataset.column_names:
            _raise_no_prompt_column(self.spec, dataset.column_names)
        id_column = self.spec.id_column
        return dataset, id_column is not None and id_column in dataset.column_names

    def _find_duplicates(self) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        if not self._has_id:
            empty = np.zeros(0, dtype=np.int64)
            return empty, empty
        if self._records:
            ids = self._arrow["id"]
            index = self._arrow["index"].to_numpy()
        else:
            assert self.spec.id_column is not None
            ids = _ids_as_strings(self._arrow[self.spec.id_column])
            index = np.arange(self._num_source_rows, dtype=np.int64)
        return _duplicates(ids, index)

    def _content_digest(self) -> str:
        if self._digest is None:
            if self._path is None:  # a hub dataset: trust datasets' own fingerprint
                self._digest = f"hub:{self.spec.path}:{self._source_fingerprint}"
            else:
                self._digest = _path_digest(self._path, self._cache_dir)
        return self._digest

    # -- rows ------------------------------------------------------------------------

    def _items(self, table: pa.Table, rows: npt.NDArray[np.int64]) -> Iterator[PromptRow | BadRow]:
        if self._records:
            indices = table.column("index").to_pylist()
            lines = table.column("line").to_pylist()
            texts = table.column("record").to_pylist()
            firsts = self._duplicates_among(indices)
            for index, line, text in zip(indices, lines, texts, strict=True):
                yield self._item(index, line, json.loads(text), firsts.get(index))
        else:
            indices = rows.tolist()
            firsts = self._duplicates_among(indices)
            for index, row in zip(indices, table.to_pylist(), strict=True):
                yield self._item(index, None, row, firsts.get(index))

    def _item(
        self, index: int, line: int | None, row: Mapping[str, Any], first: int | None
    ) -> PromptRow | BadRow:
        """The row at ``index``; ``first`` is the earlier row holding the same id, if any."""
        spec = self.spec
        prompt = row.get(spec.prompt_column, _MISSING)
        problem = _prompt_problem(prompt, spec.prompt_column)
        if problem:
            return BadRow(index, line, problem)
        if self._has_id:
            prompt_id = _id_text(row.get(spec.id_column or "", None))
            if prompt_id is None:
                return BadRow(index, line, f"id column {spec.id_column!r} is missing or empty")
            if first is not None:
                return BadRow(
                    index, line, f"duplicate id {prompt_id!r}: first used by row {first} (kept)"
                )
        else:
            prompt_id = f"row-{index:09d}"
        skip = {spec.prompt_column, spec.id_column} if self._has_id else {spec.prompt_column}
        others = {key: value for key, value in row.items() if key not in skip}
        assert isinstance(prompt, str)
        return PromptRow(
            prompt_id=prompt_id,
            prompt_index=index,
            prompt=prompt,
            metadata=_METADATA_ENCODER.encode(others),
        )

    def _duplicates_among(self, indices: list[int]) -> dict[int, int]:
        """{row index: index of the first row with its id} for the duplicates in ``indices``."""
        if not len(self._dup_rows):
            return {}
        wanted = np.asarray(indices, dtype=np.int64)
        at = np.minimum(np.searchsorted(self._dup_rows, wanted), len(self._dup_rows) - 1)
        hit = self._dup_rows[at] == wanted
        return dict(zip(wanted[hit].tolist(), self._dup_first[at[hit]].tolist(), strict=True))


# -- format resolution and loading -------------------------------------------------------


def _resolve_format(spec: DatasetSpec) -> tuple[str, Path | None]:
    """The concrete format and local path (None for a hub dataset)."""
    if spec.format == "hub":
        return "hub", None
    path = Path(spec.path).expanduser()
    if not path.exists():
        if spec.format == "auto" and _looks_like_hub_name(spec.path):
            return "hub", None
        raise DatasetError(f"dataset file {spec.path} does not exist")
    if path.is_dir():
        if spec.format not in ("auto", "disk"):
            raise DatasetError(
                f"dataset path {spec.path} is a directory; format {spec.format!r} needs a "
                "file (a datasets save_to_disk directory has format 'disk')"
            )
        return "disk", path
    if spec.format == "disk":
        raise DatasetError(f"format 'disk' needs a save_to_disk directory; {spec.path} is a file")
    if path.stat().st_size == 0:
        raise DatasetError(f"dataset file {spec.path} is empty")
    fmt = spec.format if spec.format != "auto" else _SUFFIXES.get(path.suffix.lower(), "")
    if not fmt:
        raise DatasetError(
            f"cannot tell the format of {spec.path} from its extension {path.suffix!r}; "
            "set dataset.format to one of: jsonl, json, parquet, csv"
        )
    if fmt == "json" and _first_byte(path) != b"[":
        fmt = "jsonl"  # a .json file of one object per line
    return fmt, path


def _looks_like_hub_name(text: str) -> bool:
    if text.startswith(("/", ".", "~")) or Path(text).suffix.lower() in _SUFFIXES:
        return False
    return _HUB_NAME.fullmatch(text) is not None


def _first_byte(path: Path) -> bytes:
    with path.open("rb") as handle:
        head = handle.read(4096).removeprefix(codecs.BOM_UTF8).lstrip()
    return head[:1]


def _where(row: BadRow) -> str:
    return f"line {row.line}" if row.line is not None else f"item {row.index}"


def _raise_no_prompt_column(spec: DatasetSpec, columns: list[str]) -> None:
    listed = ", ".join(columns) if columns else "(none)"
    raise DatasetError(
        f"column {spec.prompt_column!r} not found in {spec.path}; columns are: {listed}; "
        "set dataset.prompt_column"
    )


def _load_with_datasets(
    fmt: str, path: Path | None, spec: DatasetSpec, cache_dir: Path
) -> datasets.Dataset:
    hf_cache = str(cache_dir / "hf")
    try:
        if fmt == "disk":
            assert path is not None
            return _pick_split(datasets.load_from_disk(str(path)), spec)
        if fmt == "hub":
            return datasets.load_dataset(spec.path, split=spec.split, cache_dir=hf_cache)
        assert path is not None
        files = {"train": str(path)}
        features = None
        if fmt == "csv":
            names = _csv_header(path, spec)
            features = datasets.Features({name: datasets.Value("string") for name in names})
        elif pq.ParquetFile(path).metadata.num_rows == 0:  # datasets fails obscurely on it
            raise DatasetError(f"dataset {spec.path} has no rows")
        return datasets.load_dataset(
            fmt, data_files=files, split="train", cache_dir=hf_cache, features=features
        )
    except DatasetError:
        raise
    # datasets, pandas and pyarrow raise many unrelated types for a bad input; all of them
    # mean "this dataset cannot be read", which the caller must see with the cause.
    except Exception as exc:
        where = f"hub dataset {spec.path!r}" if fmt == "hub" else f"{fmt} dataset {spec.path}"
        hint = " (it is not a local path either; check the name and the network)"
        raise DatasetError(
            f"cannot read {where}{hint if fmt == 'hub' else ''}: {_describe(exc)}"
        ) from exc


def _pick_split(loaded: Any, spec: DatasetSpec) -> datasets.Dataset:
    if isinstance(loaded, datasets.DatasetDict):
        if spec.split not in loaded:
            raise DatasetError(
                f"split {spec.split!r} not found in {spec.path}; splits are: "
                f"{', '.join(loaded)}; set dataset.split"
            )
        return loaded[spec.split]
    if not isinstance(loaded, datasets.Dataset):
        raise DatasetError(f"{spec.path} is not a datasets Dataset directory")
    return loaded


def _csv_header(path: Path, spec: DatasetSpec) -> list[str]:
    """The column names; also checks that a data row follows (datasets fails obscurely)."""
    with path.open(newline="", encoding="utf-8-sig") as handle:
        reader = csv.reader(handle)
        header = next(reader, None)
        has_row = any(row for row in itertools.islice(reader, 1000))
    if not header:
        raise DatasetError(f"dataset file {spec.path} has no CSV header row")
    if not has_row:
        raise DatasetError(f"dataset {spec.path} has no rows")
    return header


def _describe(exc: BaseException) -> str:
    """The exception's message plus its causes (datasets wraps the useful one)."""
    parts: list[str] = []
    current: BaseException | None = exc
    while current is not None and len(parts) < 4:
        text = f"{type(current).__name__}: {current}".strip()
        if text not in parts:
            parts.append(text)
        current = current.__cause__ or current.__context__
    return " <- ".join(parts)


# -- JSON and JSONL validation -----------------------------------------------------------


def _cleaned_records(
    path: Path, fmt: str, spec: DatasetSpec, cache_dir: Path
) -> tuple[datasets.Dataset, _ScanReport]:
    """Validate a JSON/JSONL file into a memory-mapped Arrow file, reusing a cached one."""
    before = path.stat()
    key = _stat_key(path, before, fmt, spec.prompt_column, spec.id_column or "")
    arrow_path = cache_dir / "hermes" / f"records-{key}.arrow"
    report_path = arrow_path.with_suffix(".json")
    if arrow_path.exists() and report_path.exists():
        report = _ScanReport.from_json(report_path.read_text(encoding="utf-8"))
        return datasets.Dataset.from_file(str(arrow_path)), report
    report = _ScanReport()
    scratch = arrow_path.with_name(f"{arrow_path.name}.{os.getpid()}.{uuid.uuid4().hex}.tmp")
    try:
        with _RecordWriter(scratch) as writer:
            if fmt == "jsonl":
                _scan_jsonl(path, spec, writer, report)
            else:
                _scan_json_array(path, spec, writer, report)
        os.replace(scratch, arrow_path)
        if _stat_is_stable(path, before):
            _write_atomic(report_path, report.to_json())
    except OSError as exc:
        # Typically a full disk under output_dir: a clear message, not a pyarrow traceback.
        raise DatasetError(
            f"cannot store the validated copy of {spec.path} in {cache_dir}: {exc}; free "
            "space there or choose another output_dir"
        ) from exc
    finally:
        scratch.unlink(missing_ok=True)
    return datasets.Dataset.from_file(str(arrow_path)), report


def _scan_jsonl(path: Path, spec: DatasetSpec, writer: _RecordWriter, report: _ScanReport) -> None:
    digest = hashlib.sha256()
    index = 0
    with path.open("rb") as handle:
        for line_no, raw in enumerate(handle, start=1):
            digest.update(raw)
            line = raw.rstrip(b"\r\n")
            if line_no == 1:
                line = line.removeprefix(codecs.BOM_UTF8)
            if not line or line.isspace():
                continue
            parsed = _parse_line(line)
            if isinstance(parsed, str):
                report.reject(BadRow(index, line_no, parsed))
            else:
                obj, text = parsed
                report.accept(obj, spec)
                writer.add(index, line_no, text, _record_id(obj, spec))
            index += 1
    report.sha256 = digest.hexdigest()


def _parse_line(raw: bytes) -> tuple[dict[str, Any], str] | str:
    """The object and its text, or why the line is rejected."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"invalid UTF-8 (byte {exc.start} of the line)"
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        return f"invalid JSON at column {exc.colno}: {exc.msg}"
    except RecursionError:
        return "invalid JSON: nested too deeply"
    if not isinstance(obj, dict):
        return f"not a JSON object (a JSON {_json_type(obj)})"
    # Only a \u escape can smuggle in a lone surrogate, which no UTF-8 writer accepts.
    if b"\\u" in raw and not _is_encodable(obj):
        return "contains an unpaired UTF-16 surrogate escape (not valid Unicode text)"
    return obj, text.strip()


def _scan_json_array(
    path: Path, spec: DatasetSpec, writer: _RecordWriter, report: _ScanReport
) -> None:
    data = path.read_bytes()
    report.sha256 = hashlib.sha256(data).hexdigest()
    try:
        items = json.loads(data.decode("utf-8-sig"))
    except UnicodeDecodeError as exc:
        raise DatasetError(f"dataset file {spec.path} is not UTF-8 (byte {exc.start})") from exc
    except (json.JSONDecodeError, RecursionError) as exc:
        raise DatasetError(
            f"dataset file {spec.path} is not valid JSON ({exc}); a JSON dataset is one "
            "array of objects, or JSON Lines (one object per line)"
        ) from exc
    del data
    if not isinstance(items, list):
        raise DatasetError(f"dataset file {spec.path} must hold a JSON array of objects")
    for index, item in enumerate(items):
        if not isinstance(item, dict):
            report.reject(BadRow(index, None, f"not a JSON object (a JSON {_json_type(item)})"))
            continue
        text = json.dumps(item, ensure_ascii=False)
        if not _is_encodable(text):
            report.reject(BadRow(index, None, "contains an unpaired UTF-16 surrogate escape"))
            continue
        report.accept(item, spec)
        writer.add(index, None, text, _record_id(item, spec))


def _record_id(obj: Mapping[str, Any], spec: DatasetSpec) -> str | None:
    return None if spec.id_column is None else _id_text(obj.get(spec.id_column))


def _is_encodable(value: object) -> bool:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    names: dict[type, str] = {str: "string", list: "array", dict: "object"}
    return names.get(type(value), type(value).__name__)


# -- row semantics -----------------------------------------------------------------------


def _prompt_problem(prompt: object, column: str) -> str:
    """Why ``prompt`` cannot be used, or "" when it can."""
    if prompt is _MISSING:
        return f"prompt column {column!r} is missing"
    if prompt is None:
        return "prompt is null"
    if not isinstance(prompt, str):
        return f"prompt is a {_json_type(prompt)}, not a string"
    if not prompt.strip():
        return "prompt is empty or whitespace-only"
    return ""


def _id_text(value: object) -> str | None:
    """The prompt id a raw id value gives (None when missing or blank)."""
    if value is None:
        return None
    if isinstance(value, str):
        return value if value.strip() else None
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return json.dumps(value, sort_keys=True, ensure_ascii=False, default=_json_default)


def _json_default(value: object) -> Any:
    """JSON text for the values JSON has no type for (see the module docstring)."""
    if isinstance(value, dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode("ascii")
    return str(value)


# One encoder for every row: json.dumps with options builds a new one per call.
_METADATA_ENCODER = json.JSONEncoder(sort_keys=True, ensure_ascii=False, default=_json_default)


def _ids_as_strings(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """The id column as prompt-id strings, the same text :func:`_id_text` gives."""
    kind = column.type
    if pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_integer(kind):
        return pc.cast(column, pa.string())
    chunks = []
    for offset in range(0, len(column), 65536):
        values = column.slice(offset, 65536).to_pylist()
        chunks.append(pa.array([_id_text(v) for v in values], type=pa.string()))
    return pa.chunked_array(chunks, type=pa.string())


def _duplicates(
    ids: pa.ChunkedArray, index: npt.NDArray[np.int64]
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Row indices whose id repeats an earlier row's, sorted, and that earlier row's index."""
    table = pa.table({"id": ids, "index": pa.array(index, type=pa.int64())})
    if ids.null_count:
        table = table.filter(pc.is_valid(table.column("id")))  # a row with no id is bad anyway
    if table.num_rows < 2:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty
    order = pc.sort_indices(table, sort_keys=[("id", "ascending"), ("index", "ascending")])
    sorted_ids = table.column("id").take(order)
    sorted_index = table.column("index").take(order).to_numpy()
    same = pc.equal(sorted_ids.slice(1), sorted_ids.slice(0, table.num_rows - 1))
    starts = np.concatenate([[True], ~same.to_numpy(zero_copy_only=False)])
    run_first = sorted_index[starts][np.cumsum(starts) - 1]
    dup_rows, dup_first = sorted_index[~starts], run_first[~starts]
    by_row = np.argsort(dup_rows, kind="stable")
    return dup_rows[by_row].astype(np.int64), dup_first[by_row].astype(np.int64)


def _permutation(rows: int, spec: DatasetSpec) -> npt.NDArray[np.int64] | None:
    """Row index at each position (None: the original order)."""
    if not spec.shuffle:
        return None
    order = np.random.default_rng(spec.seed).permutation(rows).astype(np.int64)
    if spec.max_samples is not None and spec.max_samples < rows:
        order = order[: spec.max_samples].copy()  # drop the rest of the permutation
    return order


# -- content digests and stat-keyed caching ----------------------------------------------


def _stat_key(path: Path, stat: os.stat_result, *extra: str) -> str:
    ident = [_CACHE_VERSION, str(path.resolve()), stat.st_size, stat.st_mtime_ns, stat.st_ino]
    return hashlib.sha256(json.dumps([*ident, *extra]).encode()).hexdigest()[:32]


def _stat_is_stable(path: Path, before: os.stat_result) -> bool:
    after = path.stat()
    unchanged = (before.st_size, before.st_mtime_ns, before.st_ino) == (
        after.st_size,
        after.st_mtime_ns,
        after.st_ino,
    )
    return unchanged and time.time() - after.st_mtime > _RACY_WINDOW_S


def _write_atomic(path: Path, text: str) -> None:
    scratch = path.with_name(f"{path.name}.{os.getpid()}.{uuid.uuid4().hex}.tmp")
    try:
        scratch.write_text(text, encoding="utf-8")
        os.replace(scratch, path)
    finally:
        scratch.unlink(missing_ok=True)


def _path_digest(path: Path, cache_dir: Path) -> str:
    """sha256 of a file, or of a directory's files and relative names."""
    if path.is_file():
        return _file_digest(path, cache_dir)
    combined = hashlib.sha256()
    for member in sorted(p for p in path.rglob("*") if p.is_file()):
        combined.update(member.relative_to(path).as_posix().encode() + b"\0")
        combined.update(_file_digest(member, cache_dir).encode())
    return combined.hexdigest()


def _file_digest(path: Path, cache_dir: Path) -> str:
    before = path.stat()
    memo = cache_dir / "hermes" / f"sha256-{_stat_key(path, before)}"
    if memo.exists():
        return memo.read_text(encoding="utf-8").strip()
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    text = digest.hexdigest()
    if _stat_is_stable(path, before):
        _write_atomic(memo, text)
    return text
