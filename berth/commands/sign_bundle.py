"""`berth sign-bundle`: sign bundles with an Ed25519 key, so a service started with the matching public
key (BERTH_BUNDLE_PUBLIC_KEY) serves them and refuses any other (see export/bundle_writing.py, `sign_bundle`)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


def public_key_path(private_key_path: Path) -> Path:
    """Where --new-key puts the public key: beside the private one, `signing.pem` -> `signing.pub.pem`."""
    name = private_key_path.name.removesuffix(".pem")
    return private_key_path.with_name(f"{name}.pub.pem")


def new_key_pair(private_key_path: Path) -> tuple[object, Path]:
    """Generate an Ed25519 key pair: the private key (PEM, PKCS#8, unencrypted) into `private_key_path`,
    created with mode 0600, and the public key (PEM) beside it. Refuses to overwrite either."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    public_path = public_key_path(private_key_path)
    for path in (private_key_path, public_path):
        if path.exists():
            raise SystemExit(f"berth sign-bundle: {path} already exists; not overwriting a key")
    key = Ed25519PrivateKey.generate()
    private_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption())
    public_pem = key.public_key().public_bytes(serialization.Encoding.PEM,
                                               serialization.PublicFormat.SubjectPublicKeyInfo)
    private_key_path.parent.mkdir(parents=True, exist_ok=True)
    # created 0600 (never readable by others, not even for a moment), whatever the umask
    descriptor = os.open(private_key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(private_pem)
    os.chmod(private_key_path, 0o600)
    public_path.write_bytes(public_pem)
    return key, public_path


def run(args: argparse.Namespace) -> int:
    from export.bundle_writing import load_private_key, sign_bundle
    from tasks.runtime.bundle import BundleError, public_key_id

    if args.new_key is not None:
        key, public_path = new_key_pair(args.new_key)
        print(f"berth sign-bundle: new Ed25519 key pair: private {args.new_key} (mode 0600; keep it secret), "
              f"public {public_path} (give it to the service: BERTH_BUNDLE_PUBLIC_KEY)", file=sys.stderr)
    else:
        try:
            key = load_private_key(args.key)
        except BundleError as error:
            print(f"berth sign-bundle: {error}", file=sys.stderr)
            return 2
    signed = []
    for folder in args.bundles:
        try:
            bundle = sign_bundle(folder, key)
        except BundleError as error:
            print(f"berth sign-bundle: bundle {folder.name}: not signed: {error}", file=sys.stderr)
            return 2
        signed.append({"bundle": str(folder), "manifest_sha256": bundle.manifest_sha256})
    print(json.dumps({"key_id": public_key_id(key.public_key()), "signed": signed}, indent=2))
    return 0


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "sign-bundle",
        help="sign bundles with an Ed25519 key (the service can require it: BERTH_BUNDLE_PUBLIC_KEY)",
        description="Sign each BUNDLE folder: check it (files, hashes, manifest digest), then write an Ed25519 "
        "signature over its manifest digest into its bundle.json. A service started with the matching public "
        "key (--bundle-public-key, BERTH_BUNDLE_PUBLIC_KEY) refuses to start on any bundle that is unsigned, "
        "signed by another key or altered after signing. A bundle of format_version 1 is upgraded to the "
        "current format on the way. --new-key makes a key pair first.",
    )
    p.add_argument("bundles", nargs="*", type=Path, metavar="BUNDLE", help="bundle folders to sign")
    keys = p.add_mutually_exclusive_group(required=True)
    keys.add_argument("--key", type=Path, metavar="PRIVATE.pem",
                      help="the Ed25519 private key (PEM, unencrypted) to sign with")
    keys.add_argument("--new-key", type=Path, metavar="PATH",
                      help="generate a key pair: the private key into PATH (mode 0600), the public key beside it "
                           "(PATH without .pem, plus .pub.pem); then sign the BUNDLEs, if any, with it")
    p.set_defaults(func=run)
    return p
