"""Today's measured squad build: the shipped recipe with fewer training examples (the shared machine
ran at load ~22-28 on 2 cores), a capped dev evaluation, and no second round, so it ends in time."""
import dataclasses
import sys
from pathlib import Path

import berth.build_defaults as b

squad = next(r for r in b.SAMPLE_RECIPES if r.name == "squad")
b.SAMPLE_RECIPES = [dataclasses.replace(squad, options={**squad.options, "max_train_examples": int(sys.argv[1]),
                                                         "max_eval_examples": 250}, more={})]
b.build_defaults(Path("/tmp/final/models"), Path("/tmp/final/work-squad"), force=True, threads=1)
