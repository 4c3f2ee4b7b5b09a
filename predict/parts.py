"""The resumable output: a folder `OUTPUT.parts` of part files (one per window of input rows) and a manifest.

A part and its bad rows are written to temporary names and renamed; only then is the part listed in
`manifest.json` (itself replaced atomically). So a part is done exactly when the manifest lists it: a
run killed at any moment leaves at worst an unlisted (or temporary) file, which the next run overwrites.
Parts are finished in input order, so the finished ones always cover the rows before some row number,
and a resumed run starts reading there. The manifest also holds a fingerprint of what decides the
output (bundle, input file, columns, options, window size): a different job never reuses the parts.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from predict import io

MANIFEST = "manifest.json"


class ResumeRefused(RuntimeError):
    """The parts folder belongs to another job."""


@dataclass(slots=True)
class Part:
    index: int
    first_row: int
    rows: int  # input rows the part covers (written + bad)
    written: int
    errors: int

    @property
    def file_stem(self) -> str:
        return f"part-{self.index:05d}"


class PartStore:
    def __init__(self, output: Path, kind: str, fingerprint: dict[str, Any]):
        self.folder = output.with_name(output.name + ".parts")
        self.kind = kind
        self.suffix = ".parquet" if kind == "parquet" else ".jsonl"
        self.fingerprint = fingerprint
        self.parts: list[Part] = []

    def part_path(self, part: Part) -> Path:
        return self.folder / (part.file_stem + self.suffix)

    def errors_path(self, part: Part) -> Path:
        return self.folder / (part.file_stem + ".errors.jsonl")

    def open(self, restart: bool) -> list[Part]:
        """The finished parts of an earlier run of this job (none with `restart`, or when there is none)."""
        manifest = self.folder / MANIFEST
        if manifest.is_file() and not restart:
            data = json.loads(manifest.read_text(encoding="utf-8"))
            if data.get("fingerprint") != self.fingerprint:
                raise ResumeRefused(f"{self.folder} holds parts of another job (other bundle, input, columns, "
                                    "options or window); pass --restart to discard them")
            parts = [Part(**p) for p in data["parts"]]
            # a listed part whose files are gone ends the usable prefix: it and what follows are redone
            for at, part in enumerate(parts):
                if not (self.part_path(part).is_file() and self.errors_path(part).is_file()):
                    parts = parts[:at]
                    break
            self.parts = parts
            return list(parts)
        if self.folder.exists():
            shutil.rmtree(self.folder)
        self.folder.mkdir(parents=True)
        self._save()
        return []

    @property
    def next_row(self) -> int:
        return self.parts[-1].first_row + self.parts[-1].rows if self.parts else 0

    def add(self, first_row: int, rows: int, output_rows: list[dict[str, Any]], errors: list[dict[str, Any]],
            schema: Any) -> Part:
        part_bytes = io.encode_part(self.kind, output_rows, schema)
        return self.add_encoded(first_row, rows, part_bytes, len(output_rows), io.json_lines(errors), len(errors))

    def add_encoded(self, first_row: int, rows: int, part_bytes: bytes, written: int, error_lines: bytes,
                    errors: int) -> Part:
        """The next part from its file's bytes (`io.encode_part`) and its errors' JSON lines."""
        part = Part(len(self.parts), first_row, rows, written, errors)
        io.write_atomically(self.part_path(part), part_bytes)
        io.write_atomically(self.errors_path(part), error_lines)
        self.parts.append(part)
        self._save()
        return part

    def _save(self) -> None:
        data = {"fingerprint": self.fingerprint, "format": self.kind,
                "parts": [{"index": p.index, "first_row": p.first_row, "rows": p.rows, "written": p.written,
                           "errors": p.errors} for p in self.parts]}
        io.write_atomically(self.folder / MANIFEST, json.dumps(data, indent=1).encode("utf-8"))

    def finish(self, output: Path, errors_file: Path, schema: Any, keep: bool) -> None:
        """OUTPUT and OUTPUT.errors.jsonl from the parts, each written whole then renamed; the parts folder is
        removed afterwards unless `keep`."""
        io.concatenate([self.part_path(p) for p in self.parts], self.kind, schema, output)
        temporary = errors_file.with_name(errors_file.name + ".tmp")
        io.concatenate_bytes([self.errors_path(p) for p in self.parts], temporary)
        temporary.replace(errors_file)
        if not keep:
            shutil.rmtree(self.folder)
