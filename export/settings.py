"""The settings of `berth export`: one pydantic model, from which its flags are generated (torch-free)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from tasks.runtime.spec import Task


class ExportSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model_folder: Path = Field(description="fine-tuned model folder (a Hugging Face BERT checkpoint with "
                               "berth_task.json)")
    out: Path = Field(description="bundle folder to write (its name is the model name)")
    precision: Literal["fp32", "fp16", "int8"] = Field(
        "fp32", description="fp32: any provider; fp16: for CUDA (fp32 inputs/outputs); int8: dynamic quantization, "
        "CPU only")
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="where to validate: auto uses CUDA when onnxruntime has it, else the CPU")
    task: Task | None = Field(None, description="the task, for a folder without berth_task.json (e.g. fill-mask on "
                              "a pretrained MLM folder, embedding on any BERT or sentence-transformers folder)")
    pooling: Literal["mean", "cls", "max"] | None = Field(
        None, description="embedding: sentence pooling (default: the folder's sentence-transformers 1_Pooling "
        "config, else mean)")
    optimize: Literal["auto", "always", "never"] = Field(
        "auto", description="ONNX Runtime's offline BERT fusions: auto keeps whichever fp32 graph runs faster here")
    data_dir: Path | None = Field(None, description="your data folder (see docs/data.md), for the parity slice "
                                  "(default: $BERTH_SHARED_DATA or the data folder beside a checkout, if present; "
                                  "else the shipped samples)")
    parity_examples: int | None = Field(None, gt=0, description="dev examples checked (default by task: 256 "
                                        "classification/pair, 128 ner/fill-mask, 100 qa)")
    min_agreement: float = Field(0.99, ge=0, le=1, description="fp16/int8: share of examples whose task answer must "
                                 "match PyTorch; recorded in the manifest")
    int8_recipe: str | None = Field(None, description="int8: how to quantize (default: rowwise-keep-early-ffn-emb8, "
                                    "chosen by measurement; see docs/ENGINE.md section 3)")
    calibration_data: Path | None = Field(None, description="int8 static: training file to calibrate on (default: "
                                          "the one in the folder's finetune_run.json)")
    dev_data: Path | None = Field(None, description="fp16/int8: dev file with gold answers for the metric gate "
                                  "(default: the one in finetune_run.json; without one only agreement is checked)")
    metric_examples: int | None = Field(None, gt=0, description="dev examples the metric gate scores (default "
                                        "1000, or the whole dev file if smaller)")
    threads: int | None = Field(None, gt=0, description="CPU threads for PyTorch and ONNX Runtime (default: all "
                                "cores)")
    examples: Path | None = Field(None, description="JSON file: a list of example `inputs` of the task's route, "
                                  "written into the manifest (shown in GET /v1/models and offered by the playground)")
    force: bool = Field(False, description="replace an existing bundle at --out")
    allow_batch_dependent: bool = Field(
        False, description="ship a bundle whose outputs move with their batch neighbours beyond the batch-invariance "
        "gate's bound (1e-3), marked batch_dependent in its manifest and in GET /v1/models; without it such an "
        "export fails")


def out_refusal(out: Path, force: bool, force_name: str = "--force", flag: str = "--out") -> str | None:
    """Why the bundle may not be written to `out` (named by `flag`), or None. Only a bundle is ever replaced (with
    `force`): a file, or a folder holding anything but a bundle, is never moved or removed."""
    if out.exists() and not out.is_dir():
        return f"{flag} {out} is a file; name a folder for the bundle"
    if (out / "bundle.json").is_file():
        return None if force else f"{out} already holds a bundle; use {force_name} to replace it"
    if out.is_dir() and any(out.iterdir()):
        return (f"{flag} {out} holds files and is not a bundle; name a new or empty folder (only a bundle is ever "
                "replaced)")
    return None


def missing_input(settings: ExportSettings) -> str | None:
    """The first file named by the settings that is not there, said as its flag, or None."""
    for name in ("dev_data", "calibration_data", "examples"):
        path = getattr(settings, name)
        if path is not None and not path.is_file():
            return f"--{name.replace('_', '-')} {path}: no such file"
    return None
