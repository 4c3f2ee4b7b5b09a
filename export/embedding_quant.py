"""int8 word embeddings: the word-embedding table of an int8 bundle stored as 8-bit codes, a scale and a zero
point per block of `BLOCK_SIZE` values of a row, looked up by ONNX Runtime's `GatherBlockQuantized` contrib op
(CPU kernel, uint8 codes with `bits=8`), which dequantizes only the rows a batch gathers.

The int8 recipes (export/precision.py) quantize MatMuls only, so without this the 30,522 x 384 fp32 table of
a MiniLM (45 MiB, as much as every quantized MatMul together) stays fp32 in every int8 bundle and in every
server holding one. With it the table is 11.2 MiB of codes plus 1.7 MiB of scales and zero points.

Only the Gather that looks the table up from `input_ids` is replaced, and only when nothing else reads the
table: a graph whose table is also read by a fused EmbedLayerNormalization (the offline optimizer's graph, which
int8 bundles never quantize, export/bundle_builder.py) or a tied decoder MatMul is left as it is, with the reason.

Two ways in: the recipes with `word_embeddings="uint8"` (export/precision.py) apply it during `berth export`,
before the parity and metric gates against PyTorch; `convert_bundle` (and `python -m export.embedding_quant
BUNDLE...`) converts an existing int8 bundle folder without its checkpoint, gated against the unconverted bundle
on the parity slice and, when the manifest names a dev file, against the manifest's PyTorch metric.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

BLOCK_SIZE = 32  # values of a row sharing a scale and zero point (GatherBlockQuantized: a power of two >= 16;
#                  32 moved fp32 MiniLM sentence embeddings by 0.0015 at most, 128 by 0.0020, for 1.2 MiB more)
MIN_ROWS = 1000  # a table this large is a vocabulary, not positions or token types
CONTRIB_DOMAIN = "com.microsoft"


class NotQuantizable(ValueError):
    """The graph has no word-embedding lookup this step can replace; the message says why."""


def quantize_table(table: np.ndarray, block_size: int = BLOCK_SIZE) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(codes uint8 (rows, cols), scales float32 (rows, blocks), zero points uint8 (rows, blocks)) of a 2-D
    float table, asymmetric per block of `block_size` values of a row; each block's range includes 0."""
    rows, cols = table.shape
    blocks = -(-cols // block_size)
    padded = np.zeros((rows, blocks * block_size), np.float32)
    padded[:, :cols] = table
    grouped = padded.reshape(rows, blocks, block_size)
    # a padded tail block's zeros are inside the range anyway (it includes 0)
    low = np.minimum(grouped.min(axis=2), 0.0)
    high = np.maximum(grouped.max(axis=2), 0.0)
    scales = ((high - low) / 255.0).astype(np.float32)
    scales[scales == 0] = 1.0  # an all-zero block
    zero_points = np.clip(np.round(-low / scales), 0, 255)
    codes = np.clip(np.round(grouped / scales[..., None]) + zero_points[..., None], 0, 255)
    return (codes.reshape(rows, -1)[:, :cols].astype(np.uint8), scales, zero_points.astype(np.uint8))


def dequantize_table(codes: np.ndarray, scales: np.ndarray, zero_points: np.ndarray,
                     block_size: int = BLOCK_SIZE) -> np.ndarray:
    """The float table `GatherBlockQuantized` reads from (codes - zero point) * scale."""
    cols = codes.shape[1]
    scale = np.repeat(scales, block_size, axis=1)[:, :cols]
    zero = np.repeat(zero_points, block_size, axis=1)[:, :cols].astype(np.float32)
    return (codes.astype(np.float32) - zero) * scale


def word_embedding_lookup(graph: Any) -> tuple[Any, Any]:
    """(the Gather node, its table initializer) of the word embeddings; raises NotQuantizable saying why not."""
    initializers = {init.name: init for init in graph.initializer}
    readers: dict[str, list[Any]] = {}
    for node in graph.node:
        for name in node.input:
            if name in initializers:
                readers.setdefault(name, []).append(node)
    tables = [(node, initializers[node.input[0]]) for node in graph.node
              if node.op_type == "Gather" and node.input[0] in initializers
              and len(initializers[node.input[0]].dims) == 2 and initializers[node.input[0]].dims[0] >= MIN_ROWS
              and initializers[node.input[0]].data_type == 1]  # float32
    fused = [node for node in graph.node if node.op_type == "EmbedLayerNormalization"]
    if not tables:
        if fused:
            raise NotQuantizable("the word embeddings are read by a fused EmbedLayerNormalization (an offline-"
                                 "optimized graph); quantize the plain graph")
        raise NotQuantizable(f"no fp32 Gather on a table of at least {MIN_ROWS} rows")
    by_ids = [pair for pair in tables if pair[0].input[1] == "input_ids"]
    node, table = (by_ids or sorted(tables, key=lambda pair: -pair[1].dims[0]))[0]
    others = [n.op_type for n in readers[table.name] if n is not node]
    if others:
        raise NotQuantizable(f"the word-embedding table {table.name} is also read by {', '.join(sorted(set(others)))}"
                             " (tied or fused): quantizing the lookup alone would keep the fp32 table")
    return node, table


def quantize_word_embeddings(source: str | Path, target: str | Path, block_size: int = BLOCK_SIZE) -> dict[str, Any]:
    """Write `source` to `target` with its word-embedding Gather replaced by GatherBlockQuantized on uint8 codes;
    the record of what changed (for the manifest). Raises NotQuantizable when the graph has no such lookup."""
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(str(source))
    graph = model.graph
    node, table = word_embedding_lookup(graph)
    values = numpy_helper.to_array(table).astype(np.float32)
    codes, scales, zero_points = quantize_table(values, block_size)
    error = np.abs(dequantize_table(codes, scales, zero_points, block_size) - values)
    names = [f"{table.name}.{suffix}" for suffix in ("quantized", "scales", "zero_points")]
    replacement = helper.make_node(
        "GatherBlockQuantized", [names[0], node.input[1], names[1], names[2]], list(node.output),
        name=f"{node.name}_block_quantized", domain=CONTRIB_DOMAIN,
        gather_axis=0, quantize_axis=1, block_size=block_size, bits=8)
    position = list(graph.node).index(node)
    graph.node.remove(node)
    graph.node.insert(position, replacement)
    graph.initializer.remove(table)
    graph.initializer.extend([numpy_helper.from_array(codes, names[0]), numpy_helper.from_array(scales, names[1]),
                              numpy_helper.from_array(zero_points, names[2])])
    if not any(opset.domain == CONTRIB_DOMAIN for opset in model.opset_import):
        model.opset_import.append(helper.make_opsetid(CONTRIB_DOMAIN, 1))
    onnx.save(model, str(target))
    return {
        "table": table.name, "shape": list(values.shape), "op": "GatherBlockQuantized", "codes": "uint8",
        "block_size": block_size, "scale": "per block of a row, asymmetric (zero point), range including 0",
        "bytes_before": int(values.nbytes), "bytes_after": int(codes.nbytes + scales.nbytes + zero_points.nbytes),
        "table_max_abs_error": float(error.max()), "table_mean_abs_error": float(error.mean()),
    }


def convert_bundle(folder: str | Path, out: str | Path | None = None, data_dir: str | Path | None = None,
                   examples: int | None = None, threads: int = 0, min_agreement: float | None = None,
                   block_size: int = BLOCK_SIZE) -> dict[str, Any]:
    """Quantize the word embeddings of the int8 bundle in `folder`, written to `out` (default: in place), without
    its checkpoint. Gated against the unconverted bundle: the task answers on the parity slice must agree on
    `min_agreement` of the examples where it is confident, and when the manifest's metric gate names a dev file
    still present, the converted bundle's metric there must stay within the gate's drop of the manifest's PyTorch
    reference. Raises `parity.ParityError` (nothing written) when either fails; returns the report, also written
    into the manifest (`optimization.int8.word_embeddings`). The bundle's signature, if any, is dropped."""
    from export import parity
    from export.bundle_writing import write_manifest
    from tasks.bundle_checks import load_bundle
    from tasks.registry import definition
    from tasks.runtime.bundle import MANIFEST_FILE, MODEL_FILE, TOKENIZER_FILE
    from tasks.runtime.onnx_session import create_session, onnx_item_runner, onnx_runner
    from tasks.runtime.tokenizer import load_tokenizer

    folder = Path(folder)
    out = Path(out) if out is not None else folder
    bundle = load_bundle(folder)
    if bundle.precision != "int8":
        raise ValueError(f"{folder}: a {bundle.precision} bundle; int8 word embeddings are for int8 bundles")
    manifest = json.loads((folder / MANIFEST_FILE).read_text(encoding="utf-8"))
    done = (manifest.get("optimization", {}).get("int8") or {}).get("word_embeddings")
    if done == "uint8" or isinstance(done, dict):
        raise ValueError(f"{folder}: its word embeddings are quantized already")
    spec = bundle.spec()
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{out.name}-embq-", dir=out.parent) as scratch_name:
        scratch = Path(scratch_name) / "bundle"
        shutil.copytree(folder, scratch)
        record = quantize_word_embeddings(folder / MODEL_FILE, scratch / MODEL_FILE, block_size)
        tokenizer = load_tokenizer(scratch / TOKENIZER_FILE)
        task = definition(spec.task)
        data = Path(data_dir) if data_dir else parity.default_data_dir()
        slice_, source = parity.parity_slice(spec, tokenizer, data, examples or task.parity_examples)
        reference, _ = create_session(folder / MODEL_FILE, "int8", threads, prefer_gpu=False)
        candidate, _ = create_session(scratch / MODEL_FILE, "int8", threads, prefer_gpu=False)
        agreement = manifest.get("parity", {}).get("threshold", {}).get("confident_agreement", parity.MIN_AGREEMENT)
        report = parity.check_parity(spec, slice_, onnx_runner(reference, task.output_names),
                                     onnx_runner(candidate, task.output_names), "int8", "CPUExecutionProvider",
                                     source, raise_on_failure=False,
                                     min_agreement=agreement if min_agreement is None else min_agreement)
        gate: dict[str, Any] = {"against": "the unconverted bundle", "parity": {
            k: report[k] for k in ("passed", "max_abs_diff", "max_abs_diff_by_output", "mean_abs_diff", "agreement",
                                   "confident_agreement", "examples", "data")}}
        passed = report["passed"]
        metric = None
        recorded = manifest.get("parity", {}).get("metric") or {}
        dev_file = Path(recorded["data"]) if recorded.get("data") else None
        if dev_file is not None and dev_file.is_file():
            metric = parity.metric_gate(spec, tokenizer, dev_file, onnx_item_runner(reference),
                                        onnx_item_runner(candidate), recorded.get("examples"))
            drop = recorded.get("max_drop_points", parity.MAX_METRIC_DROP)
            gate["metric"] = {"name": metric["name"], "unconverted": metric["reference"],
                              "converted": metric["candidate"], "pytorch_reference": recorded["reference"],
                              "floor": round(recorded["reference"] - drop, 3), "examples": metric["examples"],
                              "data": metric["data"],
                              "passed": bool(metric["candidate"] >= recorded["reference"] - drop)}
            # reported as the export gate reports it: against PyTorch's figure from the manifest
            metric = {**metric, "reference": recorded["reference"], "max_drop_points": drop,
                      "delta_points": round(metric["candidate"] - recorded["reference"], 3),
                      "passed": gate["metric"]["passed"]}
            passed = passed and metric["passed"]
        gate["passed"] = bool(passed)
        log.info("%s: word embeddings %d -> %d bytes; %s", folder.name, record["bytes_before"], record["bytes_after"],
                 parity.format_report({**report, "metric": metric}))
        if not passed:
            raise parity.ParityError({**report, "passed": False, "metric": metric})
        record = {**record, "gate": gate}
        optimization = manifest.setdefault("optimization", {})
        optimization.setdefault("int8", {})["word_embeddings"] = record
        manifest.pop("manifest_sha256", None)
        write_manifest(scratch, manifest)
        if out.exists():
            shutil.rmtree(out)
        shutil.move(str(scratch), str(out))
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="int8 word embeddings for existing int8 bundles (in place, or into "
                                                 "--out), gated against the unconverted bundle")
    parser.add_argument("bundles", nargs="+", type=Path, help="int8 bundle folders")
    parser.add_argument("--out", type=Path, help="a folder to write the converted bundles into, by name "
                                                 "(default: in place)")
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--examples", type=int, help="parity examples (default: the task's)")
    parser.add_argument("--report", type=Path, help="write every bundle's record as JSON")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    records = {}
    for folder in args.bundles:
        target = args.out / folder.name if args.out else folder
        records[folder.name] = convert_bundle(folder, target, threads=args.threads, examples=args.examples)
        gate = records[folder.name]["gate"]
        print(f"{folder.name}: converted into {target}; max |Δ| {gate['parity']['max_abs_diff']:.4g}, agreement "
              f"{gate['parity']['agreement']:.2%}" + (f", {gate['metric']['name']} {gate['metric']['unconverted']} -> "
                                                       f"{gate['metric']['converted']}" if "metric" in gate else ""))
    if args.report:
        args.report.write_text(json.dumps(records, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
