"""THE BUNDLE: the folder that export writes and the service serves, and its verification.

A bundle is a folder (folder name = model name) holding `model.onnx`, `tokenizer.json` and
`bundle.json`, the manifest: what the model is for (task, labels, task settings), how it was built
(precision, opset, optimization, parity figures), the sha256 of every file and, since format_version 2,
the sha256 of the manifest itself (`manifest_sha256`, see `manifest_digest`), optionally signed with an
Ed25519 key (`signature`, see export/bundle_writing.py's `sign_bundle`). The service trusts nothing else:
`read_bundle` refuses a bundle with a missing or altered file, an edited manifest, an unknown format version, a
malformed manifest or a model that reads external data from outside what the manifest lists, with a
`BundleError` that names the culprit. Torch-free; `cryptography` is imported only to verify.

This floor knows no task: what a bundle's task asks of it (a known task, its outputs, labels and examples) is
checked by the `TaskChecks` the caller passes, the task layer's (`tasks.bundle_checks.load_bundle` passes them).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import logging
import mmap
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, ValidationInfo, field_validator

from tasks.runtime.protobuf_wire import WireError, next_field, varint
from tasks.runtime.spec import Task, TaskSpec

log = logging.getLogger(__name__)

# 2: the manifest carries `manifest_sha256` (and may carry `signature`). 1: neither; still read, with a
# warning (see read_bundle).
FORMAT_VERSION = 2
READABLE_FORMAT_VERSIONS = (1, 2)
MANIFEST_FILE = "bundle.json"
MODEL_FILE = "model.onnx"
TOKENIZER_FILE = "tokenizer.json"
REQUIRED_FILES = (MODEL_FILE, TOKENIZER_FILE)
DIGEST_FIELD = "manifest_sha256"
SIGNATURE_FIELD = "signature"
# The fields the digest does not cover: the digest itself, and the signature made over it.
UNDIGESTED_FIELDS = (DIGEST_FIELD, SIGNATURE_FIELD)
SIGNATURE_ALGORITHM = "ed25519"
# What is signed: this prefix and the manifest digest in hex (the prefix keeps a bundle signature from
# passing for a signature over anything else made with the same key).
SIGNED_PREFIX = b"berth bundle manifest sha256:"
TASK_SETTING_NAMES = (
    "max_seq_length",
    "doc_stride",
    "max_query_length",
    "version_2_with_negative",
    "null_score_diff_threshold",
)
Precision = Literal["fp32", "fp16", "int8"]

# Where each precision may run. int8 dynamic quantization (MatMulInteger / DynamicQuantizeLinear)
# has no CUDA kernels; fp16 is meant for CUDA (on CPU it runs, but slower than fp32).
PRECISION_PROVIDERS: dict[str, list[str]] = {
    "fp32": ["CUDAExecutionProvider", "CPUExecutionProvider"],
    "fp16": ["CUDAExecutionProvider"],
    "int8": ["CPUExecutionProvider"],
}
_warned_legacy: set[Path] = set()  # format_version 1 manifests already warned about (one line per bundle)


@dataclass(frozen=True)
class TaskChecks:
    """What a bundle's task asks of its manifest, given by the task layer (this floor knows no task).

    known_task(task): raise ValueError (with the message to show) unless `task` is a known task; run while the
        manifest is validated, so an unknown task is reported as an invalid manifest.
    consistent(bundle, manifest_path): raise BundleError when the manifest does not fit its task (outputs,
        labels, examples); run after validation, before any file is read.
    """

    known_task: Callable[[str], None]
    consistent: Callable[[Bundle, Path], None]


class BundleError(ValueError):
    """A bundle that cannot be served as it is; the message says which file and why."""


class TensorInfo(BaseModel):
    name: str
    dtype: str
    shape: list[str | int]


class FileInfo(BaseModel):
    sha256: str
    bytes: int


class Bundle(BaseModel):
    """The manifest (bundle.json) of a bundle, plus where the bundle lies (`path`)."""

    model_config = ConfigDict(extra="allow", populate_by_name=True, protected_namespaces=())

    format_version: int
    name: str
    task: Task
    labels: list[str] = Field(default_factory=list)
    problem_type: str | None = None
    task_settings: dict[str, Any] = Field(default_factory=dict)
    precision: Precision = "fp32"
    execution_providers: list[str] = Field(default_factory=lambda: ["CPUExecutionProvider"])
    providers_validated: list[str] = Field(default_factory=list)
    opset: int
    inputs: list[TensorInfo]
    outputs: list[TensorInfo]
    files: dict[str, FileInfo]
    source: dict[str, Any] = Field(default_factory=dict)
    parity: dict[str, Any] = Field(default_factory=dict)
    optimization: dict[str, Any] = Field(default_factory=dict)
    # build-defaults' dev-metric floor check: metric, floor, value, below_floor, rounds
    quality: dict[str, Any] = Field(default_factory=dict)
    # export's batch-invariance gate (export/invariance.py): max |Δ| alone vs in a batch, changed answers
    batch_invariance: dict[str, Any] = Field(default_factory=dict)
    # manifest key "model_config" (hidden size, heads, layers, vocab); `model_config` is pydantic's own name
    encoder_config: dict[str, Any] = Field(default_factory=dict, alias="model_config")
    # example `inputs` of the task's route (the playground offers them); optional
    examples: list[Any] = Field(default_factory=list)
    berth_version: str = ""
    created_at: str = ""
    # sha256 of the manifest's canonical form (format_version 2; see manifest_digest) and its optional
    # Ed25519 signature (see export/bundle_writing.py, sign_bundle)
    manifest_sha256: str = ""
    signature: dict[str, Any] | None = None
    path: Path = Field(default=Path("."), exclude=True)
    # external data files model.onnx reads (listed in `files` and checked by read_bundle); not a manifest field
    _external_data: list[str] = PrivateAttr(default_factory=list)

    @field_validator("task")
    @classmethod
    def _known_task(cls, task: str, info: ValidationInfo) -> str:
        checks = (info.context or {}).get("task_checks")
        if checks is not None:
            checks.known_task(task)
        return task

    @property
    def model_path(self) -> Path:
        return self.path / MODEL_FILE

    @property
    def tokenizer_path(self) -> Path:
        return self.path / TOKENIZER_FILE

    @property
    def external_data(self) -> list[str]:
        """The files model.onnx keeps tensors in (ONNX external data), each listed in `files`; usually none."""
        return list(self._external_data)

    @property
    def input_names(self) -> list[str]:
        return [tensor.name for tensor in self.inputs]

    @property
    def output_names(self) -> list[str]:
        return [tensor.name for tensor in self.outputs]

    def spec(self) -> TaskSpec:
        """The task spec (labels and feature settings) the service encodes and decodes with."""
        settings = {key: value for key, value in self.task_settings.items() if key in TASK_SETTING_NAMES}
        extra = {key: value for key, value in self.task_settings.items() if key not in TASK_SETTING_NAMES}
        # the encoder's width: the embedding task estimates the JSON bytes of its vectors from it
        extra.setdefault("hidden_size", self.encoder_config.get("hidden_size"))
        return TaskSpec(
            task=self.task,
            labels=self.labels,
            problem_type=self.problem_type,
            dev_metrics=self.source.get("dev_metrics") or {},
            extra=extra,
            **settings,
        )


def file_sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def file_info(path: str | Path) -> dict[str, Any]:
    return {"sha256": file_sha256(path), "bytes": Path(path).stat().st_size}


def canonical_manifest(manifest: dict[str, Any]) -> bytes:
    """The bytes a manifest's digest is taken over: the manifest without `manifest_sha256` and `signature`,
    as JSON with sorted keys, no whitespace (separators "," and ":"), non-ASCII characters as themselves,
    encoded in UTF-8. Key order and indentation of bundle.json do not matter, any value does."""
    content = {key: value for key, value in manifest.items() if key not in UNDIGESTED_FIELDS}
    text = json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return text.encode("utf-8", "surrogatepass")


def manifest_digest(manifest: dict[str, Any]) -> str:
    """The sha256 (hex) of `canonical_manifest(manifest)`: what `manifest_sha256` holds and a signature signs."""
    return hashlib.sha256(canonical_manifest(manifest)).hexdigest()


def read_bundle(folder: str | Path, checks: TaskChecks | None, verify_hashes: bool = True,
                public_key: Any = None) -> tuple[Bundle, dict[str, Any]]:
    """Read and check the bundle in `folder`, and the manifest as read (the very dict that was checked); raise
    `BundleError` naming the problem when it is unfit.

    Checks, in order: the manifest is a JSON object of a known `format_version`, valid and (`checks`, the task
    layer's) consistent with its task; its file names stay inside the folder; its `manifest_sha256` matches its
    content (an edited label or task setting is refused as "edited after export"); every listed file is there with
    its size and (`verify_hashes`) its sha256; every external data file model.onnx reads is listed and
    lies inside the folder (`check_external_data`); and, when `public_key` (an Ed25519 public key, see
    `load_public_key`) is given, the manifest is signed by that key (`verify_signature`). `checks` None skips the
    task's checks: only for a caller that checks the task itself.

    format_version 1 manifests (written before manifest digests) still load, with a warning, since
    nothing in them can tell an edit: re-export the bundle, or sign it with `berth sign-bundle`, which
    upgrades it to format_version 2. With a `public_key`, an unsigned bundle (format 1 included) is refused.
    """
    folder = Path(folder)
    manifest_path = folder / MANIFEST_FILE
    if not folder.is_dir():
        raise BundleError(f"{folder}: not a folder; a bundle is a folder holding {MANIFEST_FILE}")
    if not manifest_path.is_file():
        raise BundleError(f"{manifest_path}: missing; is {folder} a berth bundle?")
    try:
        raw = json.loads(manifest_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise BundleError(f"{manifest_path}: malformed JSON ({error})") from error
    if not isinstance(raw, dict):
        raise BundleError(f"{manifest_path}: expected a JSON object, found {type(raw).__name__}")
    version = raw.get("format_version")
    if type(version) is not int or version not in READABLE_FORMAT_VERSIONS:
        raise BundleError(
            f"{manifest_path}: unknown format_version {version!r}; this berth reads format_version "
            f"{' and '.join(map(str, READABLE_FORMAT_VERSIONS))}"
        )
    try:
        bundle = Bundle.model_validate({**raw, "path": folder}, context={"task_checks": checks})
    except ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in item['loc'])}: {item['msg']}" for item in error.errors()
        )
        raise BundleError(f"{manifest_path}: invalid manifest ({problems})") from error
    if checks is not None:
        checks.consistent(bundle, manifest_path)
    for name in REQUIRED_FILES:
        if name not in bundle.files:
            raise BundleError(f"{manifest_path}: 'files' does not list {name}")
    for name in bundle.files:
        check_file_name(name, manifest_path)
    _check_digest(raw, version, manifest_path)
    model_sha256, locations = None, []
    for name, info in bundle.files.items():
        path = folder / name
        if not path.is_file():
            raise BundleError(f"{path}: missing (listed in {MANIFEST_FILE})")
        size = path.stat().st_size
        if size != info.bytes:
            raise BundleError(
                f"{path}: size {size} bytes differs from {info.bytes} in {MANIFEST_FILE} (truncated or altered)"
            )
        if name == MODEL_FILE:  # hashed and scanned in one read: the bytes checked are the bytes hashed
            model_sha256, locations = _hash_and_scan_model(path, verify_hashes)
            actual = model_sha256
        else:
            actual = file_sha256(path) if verify_hashes else None
        if verify_hashes and actual != info.sha256:
            raise BundleError(f"{path}: sha256 differs from {MANIFEST_FILE} (altered or corrupted)")
    bundle._external_data = check_external_data(folder, bundle.files, locations)
    if public_key is not None:
        verify_signature(raw, public_key, manifest_path)
    return bundle, raw


def _check_digest(raw: dict[str, Any], version: int, manifest_path: Path) -> None:
    stored = raw.get(DIGEST_FIELD)
    if stored is None and version < FORMAT_VERSION:
        if manifest_path.resolve() not in _warned_legacy:
            _warned_legacy.add(manifest_path.resolve())
            log.warning("%s: format_version %d, written before manifest digests: an edit of its labels or task "
                        "settings cannot be told; re-export the bundle, or sign it (berth sign-bundle), which "
                        "upgrades it to format_version %d", manifest_path, version, FORMAT_VERSION)
        return
    if not isinstance(stored, str) or not stored:
        raise BundleError(f"{manifest_path}: no {DIGEST_FIELD}; a format_version {FORMAT_VERSION} manifest carries the "
                          "sha256 of its own content (was it written by hand, or its digest removed?)")
    actual = manifest_digest(raw)
    if stored != actual:
        raise BundleError(
            f"{manifest_path}: bundle.json was edited after export: its digest ({DIGEST_FIELD} {stored[:16]}…) does "
            f"not match its content (sha256 {actual[:16]}…); labels, task settings or file hashes may have been "
            "changed. Re-export the bundle"
        )


def check_file_name(name: str, manifest_path: Path) -> None:
    """A manifest's file names stay inside the bundle folder: relative, no `..`, no backslash or drive."""
    parts = PurePosixPath(name).parts
    if (not name or PurePosixPath(name).is_absolute() or PureWindowsPath(name).drive or "\\" in name
            or ".." in parts or "\0" in name):
        raise BundleError(f"{manifest_path}: file name {name!r} is not a plain relative path inside the bundle "
                          "(absolute paths and '..' are refused)")


# -- ONNX external data -------------------------------------------------------------------------------------

# An ONNX tensor may keep its values in another file (`data_location: EXTERNAL`, the file in its
# `external_data` entry "location"). ONNX Runtime reads such files at session creation, after the hashes
# were checked: unlisted, they would be neither hashed nor confined to the bundle. The model is scanned
# here without the onnx package (the serving install has none): a walk over the protobuf wire format
# along every path where a TensorProto can be (graph initializers, node attributes, sparse tensors,
# subgraphs, training graphs, functions), skipping everything else, tensor payloads included.
_EXTERNAL = 1  # TensorProto.DataLocation.EXTERNAL
_LOCATION_FIELD = 14  # TensorProto.data_location
_ONNX_PATHS: dict[str, dict[int, str]] = {  # message -> {field number: message of that field}
    "model": {7: "graph", 20: "training", 25: "function"},  # ModelProto
    "graph": {1: "node", 5: "tensor", 15: "sparse"},  # GraphProto: node, initializer, sparse_initializer
    "node": {5: "attribute"},  # NodeProto
    "attribute": {5: "tensor", 6: "graph", 10: "tensor", 11: "graph", 22: "sparse", 23: "sparse"},  # t g tensors graphs
    "sparse": {1: "tensor", 2: "tensor"},  # SparseTensorProto: values, indices
    "training": {1: "graph", 2: "graph"},  # TrainingInfoProto: initialization, algorithm
    "function": {7: "node", 11: "attribute"},  # FunctionProto: node, attribute_proto
    "tensor": {13: "entry"},  # TensorProto.external_data (StringStringEntryProto)
}
_MAX_DEPTH = 64


def external_data_locations(data: bytes | mmap.mmap) -> list[str]:
    """The external data `location` of every tensor of a serialized ONNX model stored outside it ("" for
    an external tensor naming none), in model order. Raises BundleError when the bytes are not a protobuf."""
    found: list[str] = []
    try:
        _walk(data, 0, len(data), "model", found, 0)
    except WireError as error:
        raise BundleError(f"not a readable ONNX model (protobuf: {error})") from None
    return found


def _walk(data: Any, pos: int, end: int, message: str, found: list[str], depth: int) -> None:
    if depth > _MAX_DEPTH:
        raise WireError(f"messages nested deeper than {_MAX_DEPTH}")
    fields = _ONNX_PATHS[message]
    external, locations = False, []
    while pos < end:
        number, wire, pos, start, stop = next_field(data, pos, end)
        if wire == 0 and message == "tensor" and number == _LOCATION_FIELD:
            external = varint(data, start, stop)[0] == _EXTERNAL
        elif wire == 2:
            inner = fields.get(number)
            if inner == "entry":
                entry_key, entry_value = _entry(data, start, stop)
                if entry_key == "location":
                    locations.append(entry_value)
            elif inner is not None:
                _walk(data, start, stop, inner, found, depth + 1)
    if external or locations:  # a stray location counts too: stricter than ORT, never looser
        found.extend(locations or [""])


def _entry(data: Any, pos: int, end: int) -> tuple[str, str]:
    """A StringStringEntryProto's key and value."""
    texts = {1: "", 2: ""}
    while pos < end:
        number, wire, pos, start, stop = next_field(data, pos, end)
        if wire == 2 and number in texts:
            texts[number] = bytes(data[start:stop]).decode("utf-8", "replace")
    return texts[1], texts[2]


def _hash_and_scan_model(path: Path, want_hash: bool) -> tuple[str | None, list[str]]:
    """model.onnx's sha256 (when wanted) and external data locations, from one mapping of the file."""
    with open(path, "rb") as handle:
        if os.fstat(handle.fileno()).st_size == 0:
            return (hashlib.sha256(b"").hexdigest() if want_hash else None), []
        with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
            digest = hashlib.sha256(data).hexdigest() if want_hash else None
            try:
                return digest, external_data_locations(data)
            except BundleError as error:
                raise BundleError(f"{path}: {error}") from None


def check_external_data(folder: Path, files: dict[str, FileInfo], locations: list[str]) -> list[str]:
    """The external data files of a bundle's model (from `external_data_locations`), after checking that
    each is listed in the manifest's `files` (so hashed like any other file) and lies inside the folder:
    a plain relative name, and no symlink that leads out of it. Raises BundleError naming the file."""
    model = folder / MODEL_FILE
    root = folder.resolve()
    checked: list[str] = []
    for location in dict.fromkeys(locations):  # each once, in model order
        if not location:
            raise BundleError(f"{model}: a tensor is stored as external data but names no file (no 'location')")
        unsafe = (PurePosixPath(location).is_absolute() or PureWindowsPath(location).is_absolute()
                  or ".." in PurePosixPath(location.replace("\\", "/")).parts)
        if unsafe:
            raise BundleError(f"{model}: reads external data from {location!r}, outside the bundle folder "
                              "(absolute paths and '..' are refused)")
        if location not in files:
            raise BundleError(f"{model}: reads external data from {location!r}, which {MANIFEST_FILE} does not list "
                              "in 'files'; every external data file must be listed with its sha256")
        if not (folder / location).resolve().is_relative_to(root):
            raise BundleError(f"{folder / location}: a symlink that leads out of the bundle folder (to "
                              f"{(folder / location).resolve()}); external data files must lie inside it")
        checked.append(location)
    return checked


# -- signatures (Ed25519, with the `cryptography` package) ---------------------------------------------------

def public_key_id(public_key: Any) -> str:
    """A key's id: the sha256 (hex) of its 32 raw bytes. Written beside a signature to name the signer."""
    from cryptography.hazmat.primitives import serialization

    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()


def load_public_key(path: str | Path) -> Any:
    """An Ed25519 public key from a PEM file (as `berth sign-bundle --new-key` writes); BundleError if unfit."""
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    data = read_key_file(path, "public")
    if b"PRIVATE KEY" in data:
        raise BundleError(f"{path}: a private key; give the public key (the .pub.pem file beside it)")
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, TypeError, UnsupportedAlgorithm) as error:
        raise BundleError(f"{path}: not a PEM public key ({error})") from None
    if not isinstance(key, Ed25519PublicKey):
        raise BundleError(f"{path}: a {type(key).__name__}, not an Ed25519 public key")
    return key


def read_key_file(path: str | Path, kind: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as error:
        raise BundleError(f"{path}: cannot read the {kind} key ({error.strerror or error})") from None


def verify_signature(manifest: dict[str, Any], public_key: Any, manifest_path: Path) -> None:
    """Raise BundleError unless `manifest` carries a valid signature by `public_key` over its digest.

    Call it on a manifest whose `manifest_sha256` was checked against its content (`read_bundle` does),
    so that the signature covers the whole manifest."""
    from cryptography.exceptions import InvalidSignature

    key_id = public_key_id(public_key)
    signature = manifest.get(SIGNATURE_FIELD)
    digest = manifest.get(DIGEST_FIELD)
    if signature is None or not digest:
        raise BundleError(f"{manifest_path}: not signed, and the service requires every bundle to be signed by "
                          f"the bundle public key (key id {key_id[:16]}); sign it with "
                          f"`berth sign-bundle {manifest_path.parent} --key PRIVATE.pem`")
    value = signature.get("value") if isinstance(signature, dict) else None
    if (not isinstance(signature, dict) or signature.get("algorithm") != SIGNATURE_ALGORITHM
            or not isinstance(value, str)):
        raise BundleError(f"{manifest_path}: malformed signature (expected an object with algorithm "
                          f"{SIGNATURE_ALGORITHM!r} and a base64 value)")
    try:
        raw_signature = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise BundleError(f"{manifest_path}: malformed signature (its value is not base64)") from None
    signer = signature.get("key_id")
    if isinstance(signer, str) and signer != key_id:
        raise BundleError(f"{manifest_path}: signed by another key (key id {signer[:16]}), not by the bundle "
                          f"public key (key id {key_id[:16]})")
    try:
        public_key.verify(raw_signature, SIGNED_PREFIX + str(digest).encode("ascii", "replace"))
    except InvalidSignature:
        raise BundleError(f"{manifest_path}: the signature does not verify with the bundle public key (key id "
                          f"{key_id[:16]}): the manifest or its signature was altered after signing") from None


def find_bundles(repository: str | Path) -> list[Path]:
    """Every direct sub-folder of `repository` that holds a bundle.json, sorted by name."""
    repository = Path(repository)
    if not repository.is_dir():
        return []
    return sorted(child for child in repository.iterdir() if (child / MANIFEST_FILE).is_file())
