"""`berth predict --ray`: the same job on a Ray cluster, with the same task steps and the same output file.

    input file --a Ray Data read task on the driver's node (the local reader, a window of rows a block)-->
    windows --map_batches over an actor pool (one actor a node: the bundle's ONNX session and tokenizer,
    the local run's Predictor: prepare -> run -> decode)--> encoded parts --the driver, in window order-->
    OUTPUT.parts + manifest --> OUTPUT and OUTPUT.errors.jsonl

Nothing but Ray is needed on the workers' disks: the bundle's files go to them through the object store
(each actor writes them to a temporary folder and verifies them as `berth serve` does), the rows through
Ray Data. The input is read, and the output written, on the driver's machine only. The windows are those of
a local run with the same `--window` (the same parts and manifest, so a Ray run resumes a local one and the
other way round), results come back in window order, and OUTPUT is byte for byte what a local run writes,
up to the float sums of other thread counts. Only this module imports ray, and only the --ray path imports it.
"""

from __future__ import annotations

import pickle
import shutil
import tempfile
import time
import warnings
from collections.abc import Iterator
from dataclasses import asdict
from functools import partial
from itertools import islice
from pathlib import Path
from typing import Any

import pyarrow as pa
import ray
from ray.data import ActorPoolStrategy, DataContext, Datasource, ReadTask
from ray.data.block import BlockMetadata
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from predict import io
from predict.run import Columns, Job, Predictor, Progress, errors_path, setup, summary, task_options
from tasks.bundle_checks import load_bundle
from tasks.engine import Engine
from tasks.registry import definition


class WindowSource(Datasource):
    """The input file as a local run reads it (`predict.io`), one read task and one block (of one row) per
    window of rows: its first row number, its row count, how much of the file is behind it, its rows
    (pickled). The windows' byte offsets come from one pass over the file when the read is planned."""

    def __init__(self, path: Path, kind: str, columns: list[str], skip: int, window: int):
        self.path, self.kind, self.columns, self.window = path, kind, columns, window
        self.starts = io.row_offsets(io.open_reader(path, kind, columns), window, skip)

    def estimate_inmemory_data_size(self) -> int | None:
        return None

    def get_read_tasks(
        self, parallelism: int, per_task_row_limit: int | None = None, data_context: Any = None
    ) -> list[ReadTask]:
        metadata = BlockMetadata(num_rows=1, size_bytes=None, exec_stats=None, input_files=(str(self.path),))
        return [ReadTask(partial(self.read, number, offset), metadata) for number, offset in self.starts]

    def read(self, number: int, offset: int) -> Iterator[pa.Table]:
        reader = io.open_reader(self.path, self.kind, self.columns)
        chunk = list(islice(reader.rows(number, offset), self.window))
        yield pa.table(
            {
                "first_row": [chunk[0][0]],
                "rows": [len(chunk)],
                "fraction": [reader.fraction(chunk[-1][0] + 1)],
                "chunk": pa.array([pickle.dumps(chunk)], pa.binary()),
            }
        )


class WindowPredictor:
    """One Ray actor: the bundle (from the object store) as a local run loads it, and its Predictor."""

    def __init__(
        self,
        bundle_files: list[Any],
        job: dict[str, Any],
        id_from_column: bool,
        schema: pa.Schema,
        out_kind: str,
        id_type: str = "string",
        table_input: bool = False,
    ):
        files = bundle_files[0]
        files = ray.get(files) if isinstance(files, ray.ObjectRef) else files
        self.folder = Path(tempfile.mkdtemp(prefix="berth-bundle-"))
        for name, data in files.items():
            (self.folder / name).write_bytes(data)
        # verifies the files' hashes against bundle.json; one lane a thread on the CPU, as `berth predict`
        model = Engine.load(self.folder, threads=job["threads"], lanes=0)
        options = task_options(model.definition, job["options"])
        self.predictor = Predictor(
            model,
            options,
            Columns(**job["columns"]),
            id_from_column,
            job["max_batch_size"],
            job["pass_tokens"],
            id_type,
            table_input,
        )
        self.schema, self.out_kind = schema, out_kind

    def __call__(self, batch: pa.Table) -> pa.Table:
        out: dict[str, list[Any]] = {
            "first_row": [],
            "rows": [],
            "fraction": [],
            "part": [],
            "written": [],
            "error_lines": [],
            "errors": [],
            "node": [],
        }
        node = ray.get_runtime_context().get_node_id()
        for first_row, rows, fraction, chunk in zip(
            *(batch.column(name).to_pylist() for name in ("first_row", "rows", "fraction", "chunk"))
        ):
            window = self.predictor.prepare_window(pickle.loads(chunk))
            output = self.predictor.output_rows(window)
            out["first_row"].append(first_row)
            out["rows"].append(rows)
            out["fraction"].append(fraction)
            out["part"].append(io.encode_part(self.out_kind, output, self.schema))
            out["written"].append(len(output))
            out["error_lines"].append(io.json_lines(window.errors))
            out["errors"].append(len(window.errors))
            out["node"].append(node)
        return pa.table(out)

    def __del__(self) -> None:
        shutil.rmtree(getattr(self, "folder", ""), ignore_errors=True)


def bundle_files(folder: Path) -> dict[str, bytes]:
    """Every file of the bundle folder (model, tokenizer, manifest, signature...), by name."""
    return {path.name: path.read_bytes() for path in sorted(folder.iterdir()) if path.is_file()}


def actor_count(cpus_per_actor: float) -> int:
    """One actor per alive node that has the CPUs an actor asks for."""
    nodes = [
        n for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get("CPU", 0) >= cpus_per_actor
    ]
    return max(1, len(nodes))


def predict_on_ray(job: Job, address: str, actors: int = 0) -> dict[str, Any]:
    """Run the job on the Ray cluster at `address` ("auto": RAY_ADDRESS or the local node's cluster)."""
    started = time.monotonic()
    bundle = load_bundle(job.bundle, verify_hashes=True)
    spec = bundle.spec()
    options = task_options(definition(spec.task), job.options)
    plan = setup(job, bundle, options)
    store = plan.store
    resumed = store.open(job.restart)
    rows_done = store.next_row
    connected_here = not ray.is_initialized()
    if connected_here:
        ray.init(address=address, logging_level="WARNING", configure_logging=True)
    try:
        context = DataContext.get_current()
        context.execution_options.preserve_order = True  # windows come back in input order
        context.enable_progress_bars = False
        context.target_min_block_size = 1  # a window is a block and a task input: never coalesced with others
        cpus = float(job.threads or 1)
        actors = actors or actor_count(cpus)
        c = job.columns
        source = WindowSource(job.input, plan.in_kind, list(plan.reader.columns), rows_done, job.window)
        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        with (
            warnings.catch_warnings()
        ):  # the named scheduling parameters of newer Ray Data lack node affinity
            warnings.simplefilter("ignore")
            # reading takes no CPU slot: an actor on every slot must not starve it
            windows = ray.data.read_datasource(
                source,
                override_num_blocks=max(1, len(source.starts)),
                num_cpus=0,
                concurrency=1,
                ray_remote_args={"scheduling_strategy": here},
            )
        settings = {
            "threads": job.threads,
            "options": job.options,
            "columns": asdict(c),
            "max_batch_size": job.max_batch_size,
            "pass_tokens": job.pass_tokens,
        }
        predicted = windows.map_batches(
            WindowPredictor,
            batch_size=1,
            batch_format="pyarrow",
            num_cpus=cpus,
            compute=ActorPoolStrategy(
                size=actors, max_tasks_in_flight_per_actor=1
            ),  # a window to a free actor
            fn_constructor_args=(
                [ray.put(bundle_files(bundle.path))],
                settings,
                plan.id_from_column,
                plan.schema,
                plan.out_kind,
                plan.id_type,
                plan.in_kind in ("csv", "tsv"),
            ),
        )
        fraction, nodes = [0.0], set()
        progress = Progress(lambda _: fraction[0], rows_done, job.progress)
        for done in predicted.iter_rows() if source.starts else ():
            store.add_encoded(
                done["first_row"],
                done["rows"],
                done["part"],
                done["written"],
                done["error_lines"],
                done["errors"],
            )
            rows_done, fraction[0] = done["first_row"] + done["rows"], done["fraction"]
            nodes.add(done["node"])
            progress.update(rows_done)
        progress.update(rows_done, final=True)
    finally:
        if connected_here:
            ray.shutdown()
    store.finish(job.output, errors_path(job), plan.schema, job.keep_parts)
    return {
        **summary(job, store, resumed, rows_done, started),
        "task": definition(spec.task).name,
        "ray_address": address,
        "actors": actors,
        "nodes_used": len(nodes),
        "threads": job.threads,
    }
