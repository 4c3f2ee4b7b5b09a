"""Bundle trust: the manifest digest, Ed25519 signatures (`berth sign-bundle`) and external data files.

Real bundles: copies of the service tests' exported `sentiment` bundle (the `bundle_repository` fixture;
BERTH_TEST_REPOSITORY reuses a prebuilt one, never modified here). What the tests expect comes from
outside the code under test: the digest is recomputed here from its definition (sorted keys, compact
separators, UTF-8), keys are made by the real command, external data models are written by the onnx
package itself.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import shutil
import stat
from pathlib import Path

import numpy as np
import pytest

from berth.cli import main as berth
from export.bundle_writing import write_manifest
from service.models import RepositoryError, discover, verified_bytes
from service.settings import ServiceSettings
from tasks.bundle_checks import load_bundle
from tasks.runtime.bundle import (
    FORMAT_VERSION,
    MANIFEST_FILE,
    MODEL_FILE,
    TOKENIZER_FILE,
    BundleError,
    external_data_locations,
    load_public_key,
)

onnx = pytest.importorskip("onnx")

SOURCE = "sentiment"  # classification, labels negative / positive


def digest_of(manifest: dict) -> str:
    """The manifest digest as documented, computed independently of tasks.runtime.bundle."""
    content = {key: value for key, value in manifest.items() if key not in ("manifest_sha256", "signature")}
    return hashlib.sha256(json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
                          .encode("utf-8")).hexdigest()


def read_manifest(folder: Path) -> dict:
    return json.loads((folder / MANIFEST_FILE).read_text(encoding="utf-8"))


def write_raw(folder: Path, manifest: dict) -> None:
    """bundle.json as a hand edit leaves it (no digest recomputed)."""
    (folder / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2), encoding="utf-8")


@pytest.fixture(scope="module")
def pristine(bundle_repository, tmp_path_factory) -> Path:  # noqa: F811
    """A copy of the exported bundle, its manifest rewritten by the exporter's writer in the current format."""
    folder = tmp_path_factory.mktemp("trust") / SOURCE
    shutil.copytree(bundle_repository / SOURCE, folder)
    write_manifest(folder, read_manifest(folder))
    return folder


@pytest.fixture
def bundle(pristine, tmp_path) -> Path:
    """A bundle of its own per test: model and tokenizer hard-linked to the module's copy (only ever
    replaced, never written in place), bundle.json copied."""
    folder = tmp_path / "repository" / SOURCE
    folder.mkdir(parents=True)
    for name in (MODEL_FILE, TOKENIZER_FILE):
        os.link(pristine / name, folder / name)
    shutil.copy(pristine / MANIFEST_FILE, folder / MANIFEST_FILE)
    return folder


def new_key(path: Path, *bundles: Path) -> Path:
    """`berth sign-bundle [BUNDLE...] --new-key PATH`; returns the public key's path."""
    assert berth(["sign-bundle", *map(str, bundles), "--new-key", str(path)]) == 0
    public = path.with_name(path.name.removesuffix(".pem") + ".pub.pem")
    assert public.is_file()
    return public


# -- the manifest digest ------------------------------------------------------------------------------------

def test_an_untouched_bundle_loads_and_carries_its_digest(bundle, bundle_repository):  # noqa: F811
    manifest = read_manifest(bundle)
    loaded = load_bundle(bundle)
    assert manifest["format_version"] == loaded.format_version == FORMAT_VERSION == 2
    assert manifest["manifest_sha256"] == digest_of(manifest) == loaded.manifest_sha256
    assert loaded.labels == read_manifest(bundle_repository / SOURCE)["labels"] == ["negative", "positive"]
    # the digest is over content, not layout: another key order and indentation still load
    reordered = dict(sorted(manifest.items(), reverse=True))
    (bundle / MANIFEST_FILE).write_text(json.dumps(reordered, separators=(",", ":")), encoding="utf-8")
    assert load_bundle(bundle).labels == ["negative", "positive"]


@pytest.mark.parametrize("edit", [
    lambda m: m["labels"].reverse(),  # silently wrong labels
    lambda m: m["labels"].__setitem__(1, "positiv"),
    lambda m: m["task_settings"].__setitem__("max_seq_length", 4096),  # a 500 on long inputs
    lambda m: m["files"][MODEL_FILE].__setitem__("sha256", "0" * 64),
])
def test_an_edited_manifest_is_refused_naming_the_digest(bundle, edit):
    manifest = read_manifest(bundle)
    edit(manifest)
    write_raw(bundle, manifest)
    with pytest.raises(BundleError, match=r"bundle\.json was edited after export: its digest"):
        load_bundle(bundle)


def test_a_current_manifest_without_its_digest_is_refused(bundle):
    manifest = read_manifest(bundle)
    del manifest["manifest_sha256"]
    write_raw(bundle, manifest)
    with pytest.raises(BundleError, match="no manifest_sha256"):
        load_bundle(bundle)


def test_a_format_1_manifest_loads_with_a_warning(bundle, caplog):
    manifest = read_manifest(bundle)
    del manifest["manifest_sha256"]
    manifest["format_version"] = 1
    write_raw(bundle, manifest)
    with caplog.at_level(logging.WARNING, logger="tasks.runtime.bundle"):
        loaded = load_bundle(bundle)
    assert loaded.format_version == 1 and loaded.labels == ["negative", "positive"]
    assert "format_version 1, written before manifest digests" in caplog.text


# -- signatures ---------------------------------------------------------------------------------------------

def test_sign_bundle_makes_a_key_pair_and_signs(bundle, tmp_path):
    public = new_key(tmp_path / "keys" / "signing.pem", bundle)
    private = tmp_path / "keys" / "signing.pem"
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    assert b"BEGIN PRIVATE KEY" in private.read_bytes() and b"BEGIN PUBLIC KEY" in public.read_bytes()
    manifest = read_manifest(bundle)
    assert manifest["manifest_sha256"] == digest_of(manifest)  # signing changes no digest
    signature = manifest["signature"]
    assert signature["algorithm"] == "ed25519" and len(base64.b64decode(signature["value"])) == 64
    assert load_bundle(bundle, public_key=load_public_key(public)).name == SOURCE
    # the same key signs another bundle with --key; an existing key file is never overwritten
    assert berth(["sign-bundle", str(bundle), "--key", str(private)]) == 0
    with pytest.raises(SystemExit, match="already exists"):
        berth(["sign-bundle", "--new-key", str(private)])


def test_a_signature_by_another_key_is_refused(bundle, tmp_path):
    new_key(tmp_path / "signer.pem", bundle)
    other = new_key(tmp_path / "other.pem")
    with pytest.raises(BundleError, match="signed by another key"):
        load_bundle(bundle, public_key=load_public_key(other))
    # the signer's key id, rewritten to the other key's, does not help
    manifest = read_manifest(bundle)
    manifest["signature"]["key_id"] = hashlib.sha256(
        load_public_key(other).public_bytes_raw()).hexdigest()
    write_raw(bundle, manifest)
    with pytest.raises(BundleError, match="signature does not verify"):
        load_bundle(bundle, public_key=load_public_key(other))


def test_a_signed_manifest_edited_with_a_fresh_digest_is_refused(bundle, tmp_path):
    """The digest alone is no seal (anyone can recompute it); the signature over it is."""
    public = load_public_key(new_key(tmp_path / "signing.pem", bundle))
    manifest = read_manifest(bundle)
    manifest["labels"] = ["positive", "negative"]
    write_raw(bundle, manifest)
    with pytest.raises(BundleError, match="edited after export"):
        load_bundle(bundle, public_key=public)
    manifest["manifest_sha256"] = digest_of(manifest)
    write_raw(bundle, manifest)
    assert load_bundle(bundle).labels == ["positive", "negative"]  # without a key: a consistent manifest
    with pytest.raises(BundleError, match="signature does not verify with the bundle public key"):
        load_bundle(bundle, public_key=public)


def test_an_unsigned_bundle_is_refused_when_a_key_is_required(bundle, tmp_path):
    public = new_key(tmp_path / "signing.pem")
    with pytest.raises(BundleError, match="not signed"):
        load_bundle(bundle, public_key=load_public_key(public))
    settings = ServiceSettings(models=bundle.parent, bundle_public_key=public)
    with pytest.raises(RepositoryError, match=f"bundle {SOURCE}: .*not signed"):
        discover(settings)
    assert berth(["sign-bundle", str(bundle), "--key", str(tmp_path / "signing.pem")]) == 0
    assert [b.name for b in discover(settings)] == [SOURCE]
    with pytest.raises(RepositoryError, match="bundle_public_key: .*a private key"):
        discover(ServiceSettings(models=bundle.parent, bundle_public_key=tmp_path / "signing.pem"))


def test_signing_upgrades_a_format_1_bundle_and_refuses_a_damaged_one(bundle, tmp_path, capsys):
    manifest = read_manifest(bundle)
    del manifest["manifest_sha256"]
    manifest["format_version"] = 1
    write_raw(bundle, manifest)
    public = load_public_key(new_key(tmp_path / "signing.pem", bundle))
    upgraded = read_manifest(bundle)
    assert upgraded["format_version"] == FORMAT_VERSION and upgraded["manifest_sha256"] == digest_of(upgraded)
    assert load_bundle(bundle, public_key=public).labels == ["negative", "positive"]
    # a damaged bundle is not signed: the tokenizer replaced (the hard link kept intact), same size
    data = bytearray((bundle / TOKENIZER_FILE).read_bytes())
    data[-2] = ord(" ") if data[-2] != ord(" ") else ord("\n")
    (bundle / TOKENIZER_FILE).unlink()
    (bundle / TOKENIZER_FILE).write_bytes(bytes(data))
    before = (bundle / MANIFEST_FILE).read_bytes()
    assert berth(["sign-bundle", str(bundle), "--key", str(tmp_path / "signing.pem")]) == 2
    assert "tokenizer.json: sha256 differs" in capsys.readouterr().err
    assert (bundle / MANIFEST_FILE).read_bytes() == before


# -- external data ------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def external_model(pristine, tmp_path_factory) -> Path:
    """The bundle's model saved by onnx with its weights in an external file: model.onnx + weights.data."""
    folder = tmp_path_factory.mktemp("external")
    model = onnx.load(str(pristine / MODEL_FILE))
    onnx.save_model(model, str(folder / MODEL_FILE), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="weights.data", size_threshold=1024)
    assert (folder / "weights.data").stat().st_size > 50_000_000
    return folder


def with_external_model(bundle: Path, external_model: Path) -> None:
    (bundle / MODEL_FILE).unlink()  # a hard link: replaced, not written through
    shutil.copy(external_model / MODEL_FILE, bundle / MODEL_FILE)


def relocated(model_file: Path, location: str) -> None:
    """Point every external tensor of `model_file` at `location` (the file left as onnx wrote it otherwise)."""
    model = onnx.load(str(model_file), load_external_data=False)
    for tensor in model.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = location
    model_file.write_bytes(model.SerializeToString())


def test_external_data_not_listed_is_refused(bundle, external_model):
    with_external_model(bundle, external_model)
    os.link(external_model / "weights.data", bundle / "weights.data")  # present, but not in the manifest
    with pytest.raises(BundleError, match=r"reads external data from 'weights\.data', which bundle\.json does "
                                          "not list"):
        write_manifest(bundle, read_manifest(bundle))
    with pytest.raises(BundleError, match="does not list"):
        load_bundle(bundle, verify_hashes=False)


def test_external_data_listed_with_its_hash_loads_but_is_not_served(bundle, external_model):
    from tasks.runtime.onnx_session import create_session

    with_external_model(bundle, external_model)
    os.link(external_model / "weights.data", bundle / "weights.data")
    manifest = read_manifest(bundle)
    manifest["files"]["weights.data"] = {"sha256": "", "bytes": 0}  # write_manifest measures listed files
    write_manifest(bundle, manifest)
    loaded = load_bundle(bundle)
    assert loaded.external_data == ["weights.data"]
    assert loaded.files["weights.data"].sha256 == hashlib.sha256((bundle / "weights.data").read_bytes()).hexdigest()
    session, _ = create_session(loaded.model_path, intra_op_threads=1)  # from its path, ORT finds the file
    feeds = {name: np.ones((1, 8), dtype=np.int64) for name in loaded.input_names}
    assert session.run(loaded.output_names, feeds)[0].shape == (1, 2)
    # the service loads model.onnx from bytes, where ORT would look in its own working directory: refused
    with pytest.raises(RepositoryError, match=rf"bundle {SOURCE}: model\.onnx keeps tensors in external data files "
                                              r"\(weights\.data\)"):
        discover(ServiceSettings(models=bundle.parent))
    with pytest.raises(RepositoryError, match="keeps tensors in external data files"):
        verified_bytes(loaded, MODEL_FILE)


@pytest.mark.parametrize("location", ["../weights.data", "/tmp/weights.data", "sub/../../weights.data"])
def test_external_data_outside_the_bundle_is_refused(bundle, external_model, location):
    with_external_model(bundle, external_model)
    relocated(bundle / MODEL_FILE, location)
    os.link(external_model / "weights.data", bundle.parent / "weights.data")
    with pytest.raises(BundleError, match=r"reads external data from .*outside the bundle folder"):
        write_manifest(bundle, read_manifest(bundle))


def test_external_data_through_a_symlink_out_of_the_bundle_is_refused(bundle, external_model, tmp_path):
    with_external_model(bundle, external_model)
    outside = tmp_path / "elsewhere" / "weights.data"
    outside.parent.mkdir()
    os.link(external_model / "weights.data", outside)
    (bundle / "weights.data").symlink_to(outside)
    manifest = read_manifest(bundle)
    manifest["files"]["weights.data"] = {"sha256": "", "bytes": 0}
    with pytest.raises(BundleError, match="a symlink that leads out of the bundle folder"):
        write_manifest(bundle, manifest)


def test_the_scan_finds_external_tensors_wherever_onnx_puts_them(tmp_path):
    """Initializers, Constant attributes and tensors inside an If node's subgraphs: each saved by onnx
    into a file named after the tensor."""
    from onnx import TensorProto, helper, numpy_helper
    from onnx.external_data_helper import convert_model_to_external_data

    def constant(name: str) -> onnx.NodeProto:
        return helper.make_node("Constant", [], [name + "_out"],
                                value=numpy_helper.from_array(np.full((64,), 1.0, np.float32), name))

    def branch(name: str) -> onnx.GraphProto:
        return helper.make_graph([constant(name)], name, [],
                                 [helper.make_tensor_value_info(name + "_out", TensorProto.FLOAT, [64])])

    nodes = [constant("const_a"),
             helper.make_node("If", ["flag"], ["chosen"], then_branch=branch("then_c"), else_branch=branch("else_c")),
             helper.make_node("Add", ["chosen", "init_w"], ["y"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("flag", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64])],
        [numpy_helper.from_array(np.zeros((64,), np.float32), "init_w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    assert external_data_locations(model.SerializeToString()) == []
    convert_model_to_external_data(model, all_tensors_to_one_file=False, size_threshold=0, convert_attribute=True)
    assert sorted(external_data_locations(model.SerializeToString())) == ["const_a", "else_c", "init_w", "then_c"]
    with pytest.raises(BundleError, match="not a readable ONNX model"):
        external_data_locations(b"\x0a\xff\xff\xff")
