"""Writing and signing a bundle's manifest: the build acts on a bundle (export writes one, `berth sign-bundle` signs
one); reading and verifying it is the runtime's (tasks/runtime/bundle.py), which both check the result with.
"""

from __future__ import annotations

import base64
import json
import logging
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tasks.bundle_checks import TASK_CHECKS, load_bundle
from tasks.runtime.bundle import (
    DIGEST_FIELD,
    FORMAT_VERSION,
    MANIFEST_FILE,
    REQUIRED_FILES,
    SIGNATURE_ALGORITHM,
    SIGNATURE_FIELD,
    SIGNED_PREFIX,
    UNDIGESTED_FIELDS,
    Bundle,
    BundleError,
    file_info,
    manifest_digest,
    public_key_id,
    read_bundle,
    read_key_file,
)
from tasks.runtime.version import berth_version

log = logging.getLogger(__name__)


def write_manifest(folder: str | Path, manifest: dict[str, Any]) -> Path:
    """Write `folder`/bundle.json from `manifest`, filling in what is measured from the folder.

    Fills `files` (sha256 and size of model.onnx, tokenizer.json and any other file already
    listed), and, when absent, `name` (the folder name), `berth_version` and `created_at`; sets
    `format_version` to the current one and `manifest_sha256` to the digest of the result. A `signature`
    in `manifest` is dropped (it signed another manifest): sign again with `sign_bundle`. Checks the
    result by loading it back (hashes included), so a bundle that this function wrote is one the service
    will accept.
    """
    folder = Path(folder)
    if manifest.get(SIGNATURE_FIELD) is not None:
        log.info("%s: the manifest is rewritten, its signature dropped; sign the bundle again", folder)
    manifest = {key: value for key, value in manifest.items() if key not in UNDIGESTED_FIELDS}
    names = sorted(set(REQUIRED_FILES) | set(manifest.get("files") or {}))
    for name in names:
        if not (folder / name).is_file():
            raise BundleError(f"{folder / name}: missing; a bundle needs {', '.join(REQUIRED_FILES)}")
    manifest["files"] = {name: file_info(folder / name) for name in names}
    manifest["format_version"] = FORMAT_VERSION
    manifest.setdefault("name", folder.resolve().name)
    manifest.setdefault("berth_version", berth_version())
    manifest.setdefault("created_at", datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z"))
    manifest[DIGEST_FIELD] = manifest_digest(manifest)
    path = folder / MANIFEST_FILE
    _write_json(path, manifest)
    load_bundle(folder, verify_hashes=True)
    return path


def _write_json(path: Path, manifest: dict[str, Any]) -> None:
    """Write a manifest whole or not at all (a reader never sees half of it): a temporary file, then a rename."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        temporary.write_text(json.dumps(manifest, indent=2, sort_keys=False) + "\n", encoding="utf-8")
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


def load_private_key(path: str | Path) -> Any:
    """An Ed25519 private key from an unencrypted PEM file; BundleError if unfit."""
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    data = read_key_file(path, "private")
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except TypeError:
        raise BundleError(f"{path}: an encrypted private key; berth signs with an unencrypted one "
                          "(keep it in a secret store, file mode 0600)") from None
    except (ValueError, UnsupportedAlgorithm) as error:
        raise BundleError(f"{path}: not a PEM private key ({error})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise BundleError(f"{path}: a {type(key).__name__}, not an Ed25519 private key")
    return key


def sign_bundle(folder: str | Path, private_key: Any) -> Bundle:
    """Sign the bundle in `folder` with an Ed25519 `private_key` (see `load_private_key`); returns it, loaded
    back and verified with the matching public key.

    The bundle is checked first (`load_bundle`, hashes included): only a bundle that verifies is signed.
    The signature goes into the manifest (`signature`: algorithm, key_id and the base64 signature over
    `SIGNED_PREFIX` + `manifest_sha256`); the digest leaves it out, so signing changes no digest, and a
    bundle stays three files. A format_version 1 manifest is upgraded to format_version 2 (its digest added)
    on the way: whoever signs vouches for its content. An earlier signature is replaced.
    """
    folder = Path(folder)
    _, raw = read_bundle(folder, TASK_CHECKS, verify_hashes=True, public_key=None)
    raw = {key: value for key, value in raw.items() if key != SIGNATURE_FIELD}
    raw["format_version"] = FORMAT_VERSION
    raw[DIGEST_FIELD] = manifest_digest(raw)
    public_key = private_key.public_key()
    value = private_key.sign(SIGNED_PREFIX + raw[DIGEST_FIELD].encode("ascii"))
    raw[SIGNATURE_FIELD] = {"algorithm": SIGNATURE_ALGORITHM, "key_id": public_key_id(public_key),
                            "value": base64.b64encode(value).decode("ascii")}
    _write_json(folder / MANIFEST_FILE, raw)
    return load_bundle(folder, verify_hashes=False, public_key=public_key)
