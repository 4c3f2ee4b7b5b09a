"""Export the first-round entities checkpoint (its dev F1 0.64 met the floor once the floor was
written on conlleval's 0-1 scale; the build had compared it with 50) and write its record."""
import json
import time
from pathlib import Path

import berth.build_defaults as b

recipe = next(r for r in b.SAMPLE_RECIPES if r.name == "entities")
work, out = Path("/tmp/final/work-entities"), Path("/tmp/final/models")
checkpoint = work / "entities"
metrics = json.loads((checkpoint / "finetune_run.json").read_text())["dev_metrics"]
metric, floor = recipe.floor
quality = {"rounds": 1, "metric": metric, "floor": floor, "value": metrics[metric], "below_floor": b._below_floor(recipe, metrics)}
started, cpu = time.time(), b._cpu_seconds()
b._export(checkpoint, out / "entities", "int8", True, "[1/1] entities")
b._record_quality(out / "entities", quality)
run = json.loads((checkpoint / "finetune_run.json").read_text())
wall = run["train_minutes"] + run["eval_minutes"] + (time.time() - started) / 60
record = {"started_at": "2026-11-23T17:35:00Z", "precision": "int8", "machine": b._machine(),
          "models": [b._model_record(recipe, out / "entities", metrics, quality, wall, (b._cpu_seconds() - cpu) / 60)],
          "note": "cpu_minutes: export only; training and evaluation ran in the interrupted build process",
          "total_minutes": round(wall, 2), "load_average_end": b._load_average()}
(work / "build_record.json").write_text(json.dumps(record, indent=2) + "\n")
print("entities exported", quality)
