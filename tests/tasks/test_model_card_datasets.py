"""Which data set a model card names for a training file: its folder, unless that folder was made for one run."""

from __future__ import annotations

from tasks.model_card import dataset_name


def test_a_shared_data_file_is_named_by_its_set_folder():
    assert dataset_name("/srv/shared/data/conll2003/iob2/train.txt") == "conll2003"
    assert dataset_name("/data/squad/v1.1/train-v1.1.json") == "squad"
    assert dataset_name(None) is None


def test_a_file_in_a_temporary_folder_names_no_set(tmp_path):
    made = tmp_path / "reviews"  # a folder a test (or a one-off script) made under the temporary folder
    made.mkdir()
    assert dataset_name(made / "train.csv") is None


def test_a_repository_cloned_under_the_temporary_folder_names_its_sets(tmp_path):
    clone = tmp_path / "repo"  # e.g. a CI runner's clone in /tmp
    (clone / ".git").mkdir(parents=True)
    (clone / "data" / "samples" / "topics").mkdir(parents=True)
    assert dataset_name(clone / "data" / "samples" / "topics" / "train.jsonl") == "topics"
    assert dataset_name(tmp_path / "elsewhere" / "train.csv") is None  # beside the clone, not in it
