"""THE BUNDLE: the folder that export writes and the service serves, and its checks.

A bundle is a folder (folder name = model name) holding `model.onnx`, `tokenizer.json` and
`bundle.json`, the manifest: what the model is for (task, labels, task settings), how it was built
(precision, opset, optimization, parity figures) and the sha256 of every file. The service trusts
nothing else: `load_bundle` refuses a bundle with a missing or altered file, an unknown format
version or a malformed manifest, with a `BundleError` that names the culprit. Torch-free.
"""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from tasks.registry import definition
from tasks.spec import Task, TaskSpec

FORMAT_VERSION = 1
MANIFEST_FILE = "bundle.json"
MODEL_FILE = "model.onnx"
TOKENIZER_FILE = "tokenizer.json"
REQUIRED_FILES = (MODEL_FILE, TOKENIZER_FILE)
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
    # manifest key "model_config" (hidden size, heads, layers, vocab); `model_config` is pydantic's own name
    encoder_config: dict[str, Any] = Field(default_factory=dict, alias="model_config")
    # example `inputs` of the task's route (the playground offers them); optional
    examples: list[Any] = Field(default_factory=list)
    berth_version: str = ""
    created_at: str = ""
    path: Path = Field(default=Path("."), exclude=True)

    @field_validator("task")
    @classmethod
    def _known_task(cls, task: str) -> str:
        try:
            definition(task)
        except KeyError as error:
            raise ValueError(error.args[0]) from None
        return task

    @property
    def model_path(self) -> Path:
        return self.path / MODEL_FILE

    @property
    def tokenizer_path(self) -> Path:
        return self.path / TOKENIZER_FILE

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


def write_manifest(folder: str | Path, manifest: dict[str, Any]) -> Path:
    """Write `folder`/bundle.json from `manifest`, filling in what is measured from the folder.

    Fills `files` (sha256 and size of model.onnx, tokenizer.json and any other file already
    listed), and, when absent, `format_version`, `name` (the folder name), `berth_version` and
    `created_at`. Checks the result by loading it back (hashes included), so a bundle that this
    function wrote is one the service will accept.
    """
    folder = Path(folder)
    manifest = dict(manifest)
    names = sorted(set(REQUIRED_FILES) | set(manifest.get("files") or {}))
    for name in names:
        if not (folder / name).is_file():
            raise BundleError(f"{folder / name}: missing; a bundle needs {', '.join(REQUIRED_FILES)}")
    manifest["files"] = {name: file_info(folder / name) for name in names}
    manifest.setdefault("format_version", FORMAT_VERSION)
    manifest.setdefault("name", folder.resolve().name)
    manifest.setdefault("berth_version", _berth_version())
    manifest.setdefault("created_at", datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z"))
    path = folder / MANIFEST_FILE
    path.write_text(json.dumps(manifest, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    load_bundle(folder, verify_hashes=True)
    return path


def load_bundle(folder: str | Path, verify_hashes: bool = True) -> Bundle:
    """Read and check the bundle in `folder`; raise `BundleError` naming the problem when it is unfit."""
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
    if version != FORMAT_VERSION:
        raise BundleError(
            f"{manifest_path}: unknown format_version {version!r}; this berth reads format_version {FORMAT_VERSION}"
        )
    try:
        bundle = Bundle.model_validate({**raw, "path": folder})
    except ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in item['loc'])}: {item['msg']}" for item in error.errors()
        )
        raise BundleError(f"{manifest_path}: invalid manifest ({problems})") from error
    _check_consistency(bundle, manifest_path)
    for name in REQUIRED_FILES:
        if name not in bundle.files:
            raise BundleError(f"{manifest_path}: 'files' does not list {name}")
    for name, info in bundle.files.items():
        check_file_name(name, manifest_path)
        path = folder / name
        if not path.is_file():
            raise BundleError(f"{path}: missing (listed in {MANIFEST_FILE})")
        size = path.stat().st_size
        if size != info.bytes:
            raise BundleError(
                f"{path}: size {size} bytes differs from {info.bytes} in {MANIFEST_FILE} (truncated or altered)"
            )
        if verify_hashes and file_sha256(path) != info.sha256:
            raise BundleError(f"{path}: sha256 differs from {MANIFEST_FILE} (altered or corrupted)")
    return bundle


def check_file_name(name: str, manifest_path: Path) -> None:
    """A manifest's file names stay inside the bundle folder: relative, no `..`, no backslash or drive."""
    parts = PurePosixPath(name).parts
    if (not name or PurePosixPath(name).is_absolute() or PureWindowsPath(name).drive or "\\" in name
            or ".." in parts or "\0" in name):
        raise BundleError(f"{manifest_path}: file name {name!r} is not a plain relative path inside the bundle "
                          "(absolute paths and '..' are refused)")


def _check_consistency(bundle: Bundle, manifest_path: Path) -> None:
    task = definition(bundle.task)
    expected_outputs = list(task.output_names)
    if bundle.output_names != expected_outputs:
        raise BundleError(
            f"{manifest_path}: task {bundle.task!r} expects outputs {expected_outputs}, manifest lists {bundle.output_names}"
        )
    if task.needs_labels(bundle.problem_type) and not bundle.labels:
        raise BundleError(f"{manifest_path}: task {bundle.task!r} needs labels (problem_type {bundle.problem_type!r})")
    try:
        check_examples(bundle.task, bundle.examples)
    except BundleError as error:
        raise BundleError(f"{manifest_path}: {error}") from None


def check_examples(task: str, examples: list[Any]) -> None:
    """Raise BundleError unless every example is one valid `inputs` value of the task's route."""
    if not isinstance(examples, list):
        raise BundleError(f"examples must be a list, found {type(examples).__name__}")
    fields = definition(task).input_fields or None
    for index, example in enumerate(examples):
        where = f"examples[{index}] ({task})"
        if fields is None:
            if not _is_text(example):
                raise BundleError(f"{where}: expected a non-empty text, found {example!r:.80}")
            continue
        if not isinstance(example, dict) or set(example) != set(fields):
            raise BundleError(f"{where}: expected an object with exactly the fields {', '.join(fields)}")
        for name in fields:
            value = example[name]
            if name == "choices":
                if not (isinstance(value, list) and len(value) >= 2 and all(map(_is_text, value))):
                    raise BundleError(f"{where}: choices must be a list of 2 or more non-empty texts")
            elif not _is_text(value):
                raise BundleError(f"{where}: {name} must be a non-empty text")


def _is_text(value: Any) -> bool:
    return isinstance(value, str) and bool(value.strip())


def find_bundles(repository: str | Path) -> list[Path]:
    """Every direct sub-folder of `repository` that holds a bundle.json, sorted by name."""
    repository = Path(repository)
    if not repository.is_dir():
        return []
    return sorted(child for child in repository.iterdir() if (child / MANIFEST_FILE).is_file())


def _berth_version() -> str:
    """The installed distribution's version (the task layer does not import the berth package)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("berth")
    except PackageNotFoundError:  # run from a source tree that is not installed
        return "unknown"
