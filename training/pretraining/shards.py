"""Prepared pretraining data: the corpus cut into pieces, each built into a shard of memory-mapped arrays by
its own worker process, and a manifest written last.

A prepared folder (`berth pretrain ... --prepare-only`, `OUT/data/` by default):

    manifest.json            written last: the settings, the tokenizer's hash, the corpus files' fingerprints,
                             each shard's counts and checksums; no manifest = not prepared (yet)
    bad_lines.jsonl          the lines left out under bad_lines="skip" (file, line, reason)
    shard-000000/            one piece of the corpus (~shard_mb of text): Megatron's layout, one flat token
        train.input_ids.npy  array and the offsets into it (np.load(mmap_mode="r") reads an instance without
        train.offsets.npy    loading the rest), the [CLS] A [SEP] lengths and next-sentence labels; the same
        ...                  four for the held-out documents; unigram.npy counts the training tokens;
        shard.json           written last, so a shard without it is not committed

Why numpy files and not Arrow / mosaicml-streaming / datasets: an instance is four numbers and a run of token
ids, which numpy's own format stores as they are and memory-maps with no extra dependency; the data order over
shards (training.pretraining.stream) is a few lines on top. Arrow would add a large runtime dependency for the
same flat arrays, and streaming's remote-object-store machinery has nothing to do on one shared filesystem.

A piece is whole files (grouped up to shard_mb) or a part of one large file, cut at a blank line. A shard is a
function of its piece, the tokenizer and the settings only (its random seed is derived from the run's seed and
the shard's number), so 1 and N workers write the same bytes, and a rerun after a kill keeps every committed
shard and builds the rest. NotNext segments come from another document of the same shard (as NVIDIA's BERT
builds them per shard), from another file where the shard has several.
"""

from __future__ import annotations

import hashlib
import json
import logging
import multiprocessing
import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from training.errors import UserFacingError
from training.pretraining.corpus import corpus_files, decode_text, documents_from_text

log = logging.getLogger("berth.pretrain")

FORMAT = 1
MANIFEST = "manifest.json"
SHARD_RECORD = "shard.json"
BAD_LINES = "bad_lines.jsonl"
FIELDS = ("input_ids", "offsets", "segment_a_lengths", "next_sentence_labels")
SPLITS = ("train", "heldout")
_BOUNDARY_SEARCH = 64 << 20  # how far past a cut point a blank line is looked for, before any line end will do


@dataclass(frozen=True)
class Part:
    """Bytes [start, end) of one corpus file."""

    path: str
    start: int
    end: int


def plan_pieces(files: Sequence[Path], target_bytes: int) -> list[list[Part]]:
    """Whole files grouped up to `target_bytes`, and files larger than that cut into parts of about that size
    at blank lines (a paragraph or, in the bert format, a document ends there), each part a piece of its own."""
    pieces: list[list[Part]] = []
    group: list[Part] = []
    size = 0
    for file in files:
        length = file.stat().st_size
        if length > target_bytes:
            start = 0
            while start < length:
                end = _cut_after(file, start + target_bytes, length)
                if length - end < target_bytes // 2:
                    end = length  # no small last part: it would be a shard of too few documents
                pieces.append([Part(str(file), start, end)])
                start = end
            continue
        if group and size + length > target_bytes:
            pieces.append(group)
            group, size = [], 0
        group.append(Part(str(file), 0, length))
        size += length
    if group:
        if size < target_bytes // 2 and pieces and pieces[-1][0].start == 0 and pieces[-1][0].end == \
                Path(pieces[-1][0].path).stat().st_size:
            pieces[-1] += group  # a small tail of whole files joins the previous group of whole files
        else:
            pieces.append(group)
    return pieces


def _cut_after(file: Path, position: int, length: int) -> int:
    """The first offset after a blank line at or past `position` (else after a line end, else the file's end)."""
    if position >= length:
        return length
    with open(file, "rb") as f:
        f.seek(position)
        window = f.read(_BOUNDARY_SEARCH)
    for mark in (b"\n\n", b"\n\r\n", b"\n"):
        found = window.find(mark)
        if found >= 0:
            return position + found + len(mark)
    return length


def lines_before(path: str, offset: int) -> int:
    """How many line ends come before byte `offset` (asked only when a line cannot be decoded)."""
    count, done = 0, 0
    with open(path, "rb") as f:
        while done < offset:
            chunk = f.read(min(16 << 20, offset - done))
            if not chunk:
                break
            count += chunk.count(b"\n")
            done += len(chunk)
    return count


# -- one shard -----------------------------------------------------------------------------------------------


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(8 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _file_facts(path: Path) -> dict[str, Any]:
    st = path.stat()
    return {"bytes": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": file_sha256(path)}


def build_shard(index: int, piece: list[Part], tokenizer_json: str, settings: dict[str, Any], key: str,
                folder: Path) -> dict[str, Any]:
    """Build shard `index` from `piece` into folder/shard-<index> (through a temporary folder renamed into place)
    and return its record. A worker process runs this; it reads nothing but its piece."""
    from training.pretraining.instances import build_pretraining_instances

    tokenizer = Tokenizer.from_str(tokenizer_json)
    documents, bad_lines, latin1 = [], [], []
    for part in piece:
        with open(part.path, "rb") as f:
            f.seek(part.start)
            data = f.read(part.end - part.start)
        decoded = decode_text(data, part.path, first_line=lambda p=part: lines_before(p.path, p.start) + 1,
                              encoding=settings["encoding"], bad_lines=settings["bad_lines"])
        bad_lines += decoded.bad_lines
        if decoded.latin1:
            latin1.append(part.path)
        documents += documents_from_text(decoded.text, part.path, settings["format"], settings["max_document_chars"])
    seed = shard_seed(settings["seed"], index)
    # Held-out documents only where enough stay for training (two, for next-sentence pairs), with two held out.
    enough = 4 if settings["nsp"] else 2
    try:
        train, heldout = build_pretraining_instances(
            documents, tokenizer, max_seq_length=settings["max_seq_length"], short_seq_prob=settings["short_seq_prob"],
            nsp=settings["nsp"], dupe_factor=settings["dupe_factor"],
            heldout_fraction=settings["heldout_fraction"] if len(documents) >= enough else 0.0, seed=seed)
    except ValueError as error:  # e.g. next-sentence prediction over a single document
        files = ", ".join(sorted({p.path for p in piece}))
        raise UserFacingError(f"{files}: {error}") from None
    name = f"shard-{index:06d}"
    tmp = folder / f"{name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    small_vocab = tokenizer.get_vocab_size() <= np.iinfo(np.uint16).max
    record: dict[str, Any] = {"index": index, "key": key, "piece": [asdict(p) for p in piece],
                              "bad_lines": len(bad_lines), "read_as_latin1": latin1, "files": {}}
    for split, instances in (("train", train), ("heldout", heldout)):
        arrays = {
            "input_ids": (instances.input_ids.astype(np.uint16 if small_vocab else np.int32)
                          if instances is not None else np.zeros(0, np.uint16)),
            "offsets": instances.offsets if instances is not None else np.zeros(1, np.int64),
            "segment_a_lengths": instances.segment_a_lengths if instances is not None else np.zeros(0, np.int32),
            "next_sentence_labels": instances.next_sentence_labels if instances is not None else np.zeros(0, np.int8),
        }
        for field, array in arrays.items():
            np.save(tmp / f"{split}.{field}.npy", np.ascontiguousarray(array))
        lengths = np.diff(arrays["offsets"])
        record[split] = {"instances": int(lengths.size), "tokens": int(lengths.sum()),
                         "longest": int(lengths.max()) if lengths.size else 0}
    unigram = np.bincount(train.input_ids.astype(np.int64), minlength=tokenizer.get_vocab_size()).astype(np.int64)
    np.save(tmp / "unigram.npy", unigram)
    for path in sorted(tmp.glob("*.npy")):
        record["files"][path.name] = {"bytes": path.stat().st_size, "sha256": file_sha256(path)}
    record["documents"] = len(documents)
    _write_json(tmp / SHARD_RECORD, record)
    final = folder / name
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    for file_name in record["files"]:  # mtimes after the rename: what `verify` compares before hashing again
        record["files"][file_name]["mtime_ns"] = (final / file_name).stat().st_mtime_ns
    if bad_lines:
        _write_json(final / "bad_lines.json", bad_lines)
    return record


def derive_seed(*parts: int) -> int:
    """A seed that is a function of `parts` only (the same formula as the training loop's data order)."""
    return int(np.random.SeedSequence(list(parts)).generate_state(1, np.uint64)[0] >> 1)


def shard_seed(seed: int, index: int) -> int:
    """The seed of shard `index`: a function of the run's seed and the shard's number only."""
    return derive_seed(seed, index)


_SHARED: tuple = ()  # (tokenizer JSON, settings, key, folder): sent once per worker, not once per shard


def _build_shard_job(job: tuple[int, list[Part]]) -> dict[str, Any]:
    tokenizer_json, settings, key, folder = _SHARED
    return build_shard(*job, tokenizer_json, settings, key, folder)


def _worker_init(shared: tuple, one_thread: bool) -> None:
    global _SHARED
    _SHARED = shared
    if one_thread:
        os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one thread per worker: the workers are the parallelism


def _write_json(path: Path, value: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(value, indent=1) + "\n", encoding="utf-8")
    tmp.replace(path)


# -- the prepared folder -------------------------------------------------------------------------------------


def corpus_fingerprint(files: Sequence[Path]) -> list[dict[str, Any]]:
    """What identifies the corpus cheaply: each file's resolved path, size and modification time."""
    facts = []
    for f in files:
        st = f.stat()
        facts.append({"path": str(f.resolve()), "bytes": st.st_size, "mtime_ns": st.st_mtime_ns})
    return facts


def tokenizer_digest(tokenizer: Tokenizer) -> str:
    return hashlib.sha256(tokenizer.to_str().encode()).hexdigest()


def data_key(settings: dict[str, Any], tokenizer: Tokenizer, fingerprint: list[dict[str, Any]]) -> str:
    blob = json.dumps({"format": FORMAT, "settings": settings, "tokenizer": tokenizer_digest(tokenizer),
                       "corpus": fingerprint}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def read_manifest(folder: str | Path) -> dict[str, Any] | None:
    path = Path(folder) / MANIFEST
    if not path.is_file():
        return None
    manifest = json.loads(path.read_text(encoding="utf-8"))
    if manifest.get("format") != FORMAT:
        raise UserFacingError(f"{path}: prepared by another version of berth (format {manifest.get('format')}, "
                              f"this one reads {FORMAT}); prepare the corpus again")
    return manifest


def is_prepared(folder: str | Path) -> bool:
    return (Path(folder) / MANIFEST).is_file()


def prepare(corpus: Sequence[str | Path], tokenizer: Tokenizer, folder: str | Path, settings: dict[str, Any],
            shard_mb: float = 8.0, workers: int = 1) -> dict[str, Any]:
    """Prepare `corpus` into `folder` (see the module docstring) and return the manifest. A folder already
    prepared from the same corpus, tokenizer and settings is returned as it is; a kill leaves committed shards,
    which the next call keeps."""
    folder = Path(folder)
    try:
        files = corpus_files(corpus)
    except FileNotFoundError as error:
        raise UserFacingError(str(error)) from None
    if not files:
        raise UserFacingError(f"no corpus files (*.txt) under {', '.join(map(str, corpus))}")
    settings = {**settings, "shard_mb": shard_mb}
    fingerprint = corpus_fingerprint(files)
    key = data_key(settings, tokenizer, fingerprint)
    done = read_manifest(folder)
    if done is not None and done["key"] == key:
        return done
    if done is not None:
        (folder / MANIFEST).unlink()  # the caller decided to prepare again; its shards are rebuilt as they differ
    folder.mkdir(parents=True, exist_ok=True)
    for stale in folder.glob("shard-*.tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)
    pieces = plan_pieces(files, int(shard_mb * (1 << 20)))
    records: dict[int, dict[str, Any]] = {}
    pending = []
    for index, piece in enumerate(pieces):
        existing = _committed(folder / f"shard-{index:06d}", key, piece)
        if existing is not None:
            records[index] = existing
        else:
            pending.append((index, piece))
    for extra in folder.glob("shard-*"):
        if extra.is_dir() and int(extra.name.split("-")[1].split(".")[0]) >= len(pieces):
            shutil.rmtree(extra)
    started = time.perf_counter()
    total_bytes = sum(p.end - p.start for _, piece in pending for p in piece)
    log.info("preparing %d of %d shards (%.1f MB of text) with %d worker(s) into %s; %d already committed",
             len(pending), len(pieces), total_bytes / 1e6, workers, folder, len(records))
    for record in _run_jobs(pending, workers, (tokenizer.to_str(), settings, key, folder)):
        records[record["index"]] = record
        log.info("shard %d: %d instances, %d held out (%d/%d shards)", record["index"],
                 record["train"]["instances"], record["heldout"]["instances"], len(records), len(pieces))
    seconds = time.perf_counter() - started
    shards = [records[i] for i in range(len(pieces))]
    bad = [line for i in range(len(pieces)) for line in _bad_lines_of(folder / f"shard-{i:06d}")]
    with open(folder / BAD_LINES, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(line) + "\n" for line in bad)
    manifest = {
        "format": FORMAT, "key": key, "settings": settings, "tokenizer_sha256": tokenizer_digest(tokenizer),
        "vocab_size": tokenizer.get_vocab_size(), "corpus": fingerprint,
        "shards": [{k: r[k] for k in ("index", "train", "heldout", "files", "bad_lines", "documents",
                                      "read_as_latin1")} for r in shards],
        "totals": {split: {"instances": sum(r[split]["instances"] for r in shards),
                           "tokens": sum(r[split]["tokens"] for r in shards)} for split in SPLITS},
        "bad_lines": len(bad),
        "prepared": {"workers": workers, "seconds": round(seconds, 3), "text_bytes": total_bytes,
                     "shards_built": len(pending)},
    }
    manifest["digest"] = hashlib.sha256(json.dumps(
        [key] + [[r["files"][n]["sha256"] for n in sorted(r["files"])] for r in shards]).encode()).hexdigest()
    _write_json(folder / MANIFEST, manifest)
    if bad:
        log.warning("%d undecodable line(s) left out (bad_lines skip), listed in %s", len(bad), folder / BAD_LINES)
    log.info("prepared %d train and %d held-out instances in %d shards in %.1f s", manifest["totals"]["train"]
             ["instances"], manifest["totals"]["heldout"]["instances"], len(shards), seconds)
    return manifest


def _run_jobs(jobs: list[tuple[int, list[Part]]], workers: int, shared: tuple):
    if workers <= 1 or len(jobs) <= 1:
        _worker_init(shared, one_thread=False)
        yield from map(_build_shard_job, jobs)
        return
    with multiprocessing.get_context("spawn").Pool(min(workers, len(jobs)), initializer=_worker_init,
                                                   initargs=(shared, True)) as pool:
        yield from pool.imap_unordered(_build_shard_job, jobs)


def _committed(shard: Path, key: str, piece: list[Part]) -> dict[str, Any] | None:
    path = shard / SHARD_RECORD
    if not path.is_file():
        return None
    record = json.loads(path.read_text(encoding="utf-8"))
    if record.get("key") != key or record.get("piece") != [asdict(p) for p in piece]:
        return None
    for name, facts in record["files"].items():
        facts["mtime_ns"] = (shard / name).stat().st_mtime_ns
    return record


def _bad_lines_of(shard: Path) -> list[dict]:
    path = shard / "bad_lines.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else []


def verify(folder: str | Path, manifest: dict[str, Any]) -> None:
    """Every shard file as the manifest recorded it: the size and modification time, else the checksum (a file
    touched but not changed passes; one changed, even with the same count, is refused)."""
    folder = Path(folder)
    for shard in manifest["shards"]:
        base = folder / f"shard-{shard['index']:06d}"
        for name, facts in shard["files"].items():
            path = base / name
            if not path.is_file():
                raise UserFacingError(f"{path}: missing from the prepared data; prepare the corpus again")
            st = path.stat()
            if st.st_size == facts["bytes"] and st.st_mtime_ns == facts["mtime_ns"]:
                continue
            if st.st_size != facts["bytes"] or file_sha256(path) != facts["sha256"]:
                raise UserFacingError(f"{path} changed since it was prepared (its checksum differs from "
                                      f"{folder / MANIFEST}); prepare the corpus again into a new folder")
