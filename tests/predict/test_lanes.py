"""`berth predict` runs its passes on one-thread sessions side by side by default on the CPU (`--lanes`): the
output file is byte for byte the one a single session on every thread writes, for a sequence and a per-token
task."""

from __future__ import annotations

import pytest

from tests.predict.conftest import run_predict, write_jsonl


@pytest.mark.parametrize("bundle", ["sentiment", "entities"])
def test_lanes_write_the_file_one_session_writes(shared_data, bundle_repository, tmp_path, bundle):
    with open(shared_data / "sst2" / "train.tsv", encoding="utf-8") as f:
        texts = [line.split("\t")[0] for line in f.read().splitlines()[1:601]]
    source = write_jsonl(tmp_path / "in.jsonl", [{"id": f"t{i}", "text": t} for i, t in enumerate(texts)])
    outputs = {}
    for lanes in (1, 2):
        out = tmp_path / f"lanes-{lanes}.jsonl"
        _, summary, _ = run_predict(str(bundle_repository / bundle), str(source), "--out", str(out),
                                    "--lanes", str(lanes), "--window", "256", threads=2)
        assert summary["lanes"] == lanes and summary["threads"] == 2 and summary["written"] == 600
        outputs[lanes] = out.read_bytes()
    assert outputs[1] == outputs[2]
