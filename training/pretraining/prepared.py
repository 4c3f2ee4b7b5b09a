"""A run's data: its tokenizer (the base's, a given one, or a new WordPiece vocabulary trained on the corpus) and
its prepared shards (training.pretraining.shards), one folder per sequence length it trains at.

`OUT/data/` holds the shards at max_seq_length, `OUT/data-phase2/` those of the paper's second phase; each folder
also holds the tokenizer its shards were made with. A run reuses a folder prepared from the same corpus,
tokenizer and settings; a launch of several processes (torchrun) never prepares: it reads what a single-process
run (`--prepare-only`) prepared, and says so when that is missing or stale.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from training.errors import UserFacingError
from training.pretraining.base import Base
from training.pretraining.corpus import corpus_files, decode_text
from training.pretraining.settings import PretrainSettings
from training.pretraining.shards import (
    corpus_fingerprint,
    data_key,
    is_prepared,
    lines_before,
    plan_pieces,
    prepare,
    read_manifest,
    tokenizer_digest,
)

log = logging.getLogger("berth.pretrain")

DATA_DIR = "data"
PHASE2_DATA_DIR = "data-phase2"


@dataclass(frozen=True)
class PreparedData:
    folder: Path
    manifest: dict[str, Any]
    seq_length: int

    def record(self) -> dict[str, Any]:
        m = self.manifest
        return {"folder": str(self.folder), "digest": m["digest"], "shards": len(m["shards"]), "totals": m["totals"],
                "bad_lines": m["bad_lines"], "prepared": m["prepared"], "seq_length": self.seq_length}


def _given_prepared_folder(settings: PretrainSettings) -> Path | None:
    prepared = [p for p in settings.corpus if p.is_dir() and is_prepared(p)]
    if prepared and len(settings.corpus) > 1:
        raise UserFacingError("name either one prepared folder or the corpus files, not both")
    return prepared[0] if prepared else None


def _corpus_lines(settings: PretrainSettings) -> Iterator[str]:
    """The corpus's lines for a new vocabulary, read piece by piece with the run's encoding and bad-line rules."""
    for piece in plan_pieces(corpus_files(settings.corpus), int(settings.shard_mb * (1 << 20))):
        for part in piece:
            with open(part.path, "rb") as f:
                f.seek(part.start)
                data = f.read(part.end - part.start)
            text = decode_text(data, part.path, first_line=lambda p=part: lines_before(p.path, p.start) + 1,
                               encoding=settings.encoding, bad_lines=settings.bad_lines).text
            yield from (line.strip() for line in text.splitlines() if line.strip())


def run_tokenizer(settings: PretrainSettings, base: Base | None, may_build: bool) -> tuple[Tokenizer, str]:
    """The tokenizer of this run and where it came from."""
    from tasks.runtime.tokenizer import load_tokenizer, train_wordpiece

    kept = Path(settings.out) / DATA_DIR / "tokenizer.json"
    try:
        if base is not None:
            return load_tokenizer(base.folder), f"the base's ({base.folder})"
        if settings.tokenizer is not None:
            return load_tokenizer(settings.tokenizer), str(settings.tokenizer)
    except (OSError, ValueError) as error:
        raise UserFacingError(f"cannot load the tokenizer: {error}") from None
    if kept.is_file() and settings.resume != "never":
        return load_tokenizer(kept), f"{kept} (prepared earlier)"
    if not may_build:
        raise UserFacingError(_prepare_first(settings, "no tokenizer has been prepared in " + str(kept.parent)))
    tokenizer = train_wordpiece(vocab_size=settings.vocab_size or 30522, lowercase=settings.lowercase is not False,
                                min_frequency=settings.min_frequency, lines=_corpus_lines(settings))
    return tokenizer, f"a new {tokenizer.get_vocab_size()}-token WordPiece vocabulary trained on the corpus"


def _prepare_first(settings: PretrainSettings, why: str) -> str:
    return (f"{why}; no data is built inside a torchrun launch: prepare it first with the same command in one "
            f"process and --prepare-only (berth pretrain CORPUS --out {settings.out} ... --prepare-only)")


def _changes(manifest: dict[str, Any], wanted: dict[str, Any], tokenizer: Tokenizer,
             fingerprint: list[dict[str, Any]]) -> str:
    """What differs between a prepared folder and what this run asks, in words."""
    differences = [f"{k} {manifest['settings'].get(k)!r} -> {v!r}" for k, v in wanted.items()
                   if manifest["settings"].get(k) != v]
    if manifest["tokenizer_sha256"] != tokenizer_digest(tokenizer):
        differences.append("another tokenizer")
    before = {f["path"]: f for f in manifest["corpus"]}
    now = {f["path"]: f for f in fingerprint}
    differences += [f"{p} is new" for p in now if p not in before][:3]
    differences += [f"{p} is gone" for p in before if p not in now][:3]
    differences += [f"{p} changed" for p in now if p in before and before[p] != now[p]][:3]
    return "; ".join(differences) or "another corpus"


def prepare_run_data(settings: PretrainSettings, base: Base | None, nsp: bool, may_build: bool,
                     has_training_state: bool) -> tuple[Tokenizer, list[PreparedData]]:
    """The tokenizer and the prepared data of each phase, prepared here when missing and `may_build`."""
    lengths = [settings.max_seq_length] + ([settings.phase2_seq_length] if settings.phase2_seq_length else [])
    given = _given_prepared_folder(settings)
    if given is not None:
        return _use_given(settings, base, nsp, given)
    tokenizer, origin = run_tokenizer(settings, base, may_build)
    log.info("tokenizer: %s, %d tokens", origin, tokenizer.get_vocab_size())
    try:
        files = corpus_files(settings.corpus)
    except FileNotFoundError as error:  # under torchrun, most often the prepared folder named before it was prepared
        raise UserFacingError(str(error) if may_build else _prepare_first(settings, str(error))) from None
    fingerprint = corpus_fingerprint(files)
    prepared = []
    for length, name in zip(lengths, (DATA_DIR, PHASE2_DATA_DIR)):
        folder = Path(settings.out) / name
        wanted = {**settings.data_settings(nsp, length), "shard_mb": settings.shard_mb}
        manifest = read_manifest(folder)
        if manifest is None or manifest["key"] != data_key(wanted, tokenizer, fingerprint):
            if manifest is not None:
                change = _changes(manifest, wanted, tokenizer, fingerprint)
                if not may_build:
                    raise UserFacingError(_prepare_first(settings, f"{folder} was prepared from other data ({change})"))
                if has_training_state and settings.resume != "never":
                    raise UserFacingError(f"the data changed since {folder} was prepared ({change}); the training "
                                          "state there was made on the old data and cannot resume exactly: use "
                                          "--resume never to start over, or another --out")
                log.info("%s was prepared from other data (%s): preparing again", folder, change)
            elif not may_build:
                raise UserFacingError(_prepare_first(settings, f"{folder} holds no prepared data"))
            folder.mkdir(parents=True, exist_ok=True)
            tokenizer.save(str(folder / "tokenizer.json"))
            manifest = prepare(settings.corpus, tokenizer, folder, settings.data_settings(nsp, length),
                               settings.shard_mb, settings.workers)
        prepared.append(PreparedData(folder, manifest, length))
    return tokenizer, prepared


def _use_given(settings: PretrainSettings, base: Base | None, nsp: bool,
               folder: Path) -> tuple[Tokenizer, list[PreparedData]]:
    from tasks.runtime.tokenizer import load_tokenizer

    if settings.phase2_seq_length:
        raise UserFacingError(f"{folder} holds one sequence length; give the corpus itself for the two-phase schedule")
    manifest = read_manifest(folder)
    wanted = settings.data_settings(nsp)
    differ = [f"{k} {manifest['settings'].get(k)!r} (this run: {v!r})" for k, v in wanted.items()
              if manifest["settings"].get(k) != v and k not in ("seed",)]
    if differ:
        raise UserFacingError(f"{folder} was prepared with {', '.join(differ)}; use the same settings or prepare "
                              "the corpus again")
    tokenizer = load_tokenizer(folder / "tokenizer.json")
    if base is not None and tokenizer_digest(load_tokenizer(base.folder)) != manifest["tokenizer_sha256"]:
        raise UserFacingError(f"{folder} was prepared with another tokenizer than the base's ({base.folder})")
    if settings.tokenizer is not None and tokenizer_digest(load_tokenizer(settings.tokenizer)) != \
            manifest["tokenizer_sha256"]:
        raise UserFacingError(f"{folder} was prepared with another tokenizer than {settings.tokenizer}")
    log.info("prepared data: %s (%d shards, %d training instances)", folder, len(manifest["shards"]),
             manifest["totals"]["train"]["instances"])
    return tokenizer, [PreparedData(folder, manifest, settings.max_seq_length)]


def save_model_tokenizer(tokenizer: Tokenizer, out: Path, base: Base | None, settings: PretrainSettings) -> None:
    """The tokenizer files of the model folder: the base's own files as they are, else ours written out."""
    from tasks.runtime.tokenizer import save_tokenizer
    from training.bert.checkpoint import TOKENIZER_FILES

    out.mkdir(parents=True, exist_ok=True)
    if base is not None:
        for name in TOKENIZER_FILES:
            if (base.folder / name).is_file():
                shutil.copyfile(base.folder / name, out / name)
        return
    save_tokenizer(tokenizer, out, lowercase=settings.lowercase is not False)
