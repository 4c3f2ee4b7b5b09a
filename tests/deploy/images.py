"""The repository's Dockerfiles, built and started for real without a Docker engine.

- The base: Debian bookworm made from Debian's packages with `mmdebstrap` (Python 3.11, as in
  python:3.11-slim-bookworm, which cannot be pulled here), turned into a local image with `podman
  import`. Its tag is a hash of what goes into it (suite, mirror, packages, options, and the mirror's
  signed InRelease, which changes with every archive update), so it is built once and rebuilt only when
  one of them changes.
- The image: `podman build --isolation chroot` (no daemon, no OCI runtime) with the Dockerfile as it is.
- The container: `podman run` cannot work in this sandbox (its runtime cannot set rlimits or cgroups),
  so the built image's file system is mounted (`podman image mount`, read-only) and its entrypoint is
  started with the image's own environment, working directory and user (`chroot --userspec`), in a
  private mount namespace holding what a container runtime would provide: /proc, a read-only /sys, a
  minimal /dev, a tmpfs /tmp and the model repository bound read-only at /models. What is left out is
  the isolation a runtime adds (network namespace, cgroups, seccomp): the process shares the host's
  network, so it is told (as `docker run -e` would) to listen on a free 127.0.0.1 port.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.deploy.conftest import REPO, tail

SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
PACKAGES = ("python3", "python3-venv", "python-is-python3", "ca-certificates")
# As debian:bookworm-slim (the base of python:3.11-slim-bookworm) does: no manuals, docs or translations.
DPKG_OPTIONS = ("path-exclude=/usr/share/man/*", "path-exclude=/usr/share/locale/*", "path-exclude=/usr/share/info/*",
                "path-exclude=/usr/share/doc/*", "path-include=/usr/share/doc/*/copyright")
BASE_REPOSITORY = "localhost/berth-test-base"
# The host's CA bundle, bound over the base's own during the build: pip there (Debian's, which reads
# the system bundle) then trusts what the host trusts, e.g. an HTTPS-intercepting proxy's CA. A bind
# over an existing file leaves nothing in the image.
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")


def require_image_tools() -> None:
    """Skips, saying why, where the images cannot be built and started this way."""
    if os.geteuid() != 0:
        pytest.skip("building and starting images needs root here (podman image mount, mount namespaces, chroot)")
    for tool in ("podman", "mmdebstrap", "unshare", "chroot"):
        if not shutil.which(tool):
            pytest.skip(f"{tool} is not installed (scripts/install-deploy-tools.sh installs podman and mmdebstrap)")


def podman(*args: str, timeout: float = 120) -> str:
    result = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        raise RuntimeError(f"podman {' '.join(args)} failed ({result.returncode}):\n{result.stderr[-4000:]}")
    return result.stdout


def base_image(work: Path) -> str:
    """The local Debian base (tag by content), built with mmdebstrap and imported unless present."""
    try:
        with urllib.request.urlopen(f"{MIRROR}/dists/{SUITE}/InRelease", timeout=30) as response:
            archive_state = hashlib.sha256(response.read()).hexdigest()
    except OSError as error:
        pytest.skip(f"the Debian mirror {MIRROR} is unreachable ({error}); the base image is made from its packages")
    recipe = json.dumps([SUITE, MIRROR, "minbase", PACKAGES, DPKG_OPTIONS, archive_state])
    tag = f"{BASE_REPOSITORY}:{SUITE}-{hashlib.sha256(recipe.encode()).hexdigest()[:16]}"
    if subprocess.run(["podman", "image", "exists", tag]).returncode == 0:
        return tag
    tarball = work / "base.tar"
    command = ["mmdebstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}",
               *[f"--dpkgopt={option}" for option in DPKG_OPTIONS], SUITE, str(tarball), MIRROR]
    log = work / "mmdebstrap.log"
    with open(log, "wb") as out:
        if subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, timeout=900).returncode != 0:
            raise RuntimeError(f"mmdebstrap failed:\n{tail(log)}")
    podman("import", str(tarball), tag, timeout=300)
    tarball.unlink()
    return tag


class Build:
    """`podman build` of `dockerfile` from the repository root, as it is, running in the background
    (the test builds its bundles meanwhile). Its layers are cached (podman's default), so a rebuild
    with unchanged sources takes seconds."""

    def __init__(self, dockerfile: Path, tag: str, build_args: dict[str, str], log: Path):
        command = ["podman", "build", "--isolation", "chroot", "--format", "docker",  # docker format keeps HEALTHCHECK
                   "--ignorefile", str(dockerfile.parent / f"{dockerfile.name}.dockerignore"),
                   *[f"--build-arg={key}={value}" for key, value in build_args.items()],
                   "-f", str(dockerfile), "-t", tag]
        if HOST_CA_BUNDLE.is_file():
            command += ["-v", f"{HOST_CA_BUNDLE}:{HOST_CA_BUNDLE}:ro"]
        self.name, self.log, self.started, self.finished = dockerfile.name, log, time.monotonic(), 0.0
        with open(log, "wb") as out:
            self.process = subprocess.Popen([*command, str(REPO)], stdout=out, stderr=subprocess.STDOUT)
        self._timer = threading.Thread(target=self._time, daemon=True)
        self._timer.start()

    def _time(self) -> None:
        self.process.wait()
        self.finished = time.monotonic()

    def wait(self, timeout: float = 1500) -> float:
        """The seconds the build itself took; fails with its log if it failed."""
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise
        if code != 0:
            raise AssertionError(f"podman build -f {self.name} failed ({code}):\n{tail(self.log, 6000)}")
        self._timer.join()
        return self.finished - self.started


@dataclass
class Image:
    """A built image: its configuration (as `docker inspect` shows it) and its mounted file system."""

    tag: str
    config: dict
    healthcheck: dict | None
    size: int
    root: Path

    @classmethod
    def mount(cls, tag: str) -> Image:
        info = json.loads(podman("image", "inspect", tag))[0]
        root = Path(podman("image", "mount", tag).strip())
        return cls(tag, info["Config"], info.get("Healthcheck"), info["Size"], root)

    def unmount(self) -> None:
        podman("image", "unmount", self.tag)

    @property
    def env(self) -> dict[str, str]:
        return dict(item.split("=", 1) for item in self.config.get("Env", []))

    def user(self) -> tuple[int, int, str]:
        """(uid, gid, home) of the image's USER, resolved in its own /etc/passwd as a runtime does."""
        name, _, group = self.config.get("User", "0").partition(":")
        for line in (self.root / "etc" / "passwd").read_text().splitlines():
            fields = line.split(":")
            if name in (fields[0], fields[2]):
                return int(fields[2]), int(group or fields[3]), fields[5]
        raise AssertionError(f"USER {name} has no entry in the image's /etc/passwd")

    def executables(self) -> dict[str, Path]:
        """Every file name found on the image's PATH (the first one wins, as in a shell)."""
        found: dict[str, Path] = {}
        for folder in self.env.get("PATH", "").split(":"):
            directory = self.root / folder.lstrip("/")
            if directory.is_dir():
                for path in sorted(directory.iterdir()):
                    found.setdefault(path.name, path)
        return found


class Container:
    """A command run from the image's file system as the image's user, with its environment (plus
    `env`, as `docker run -e`), in a private mount namespace that disappears with the process.

    The shell and `unshare` exec into `chroot`, which execs `env`, which execs the command: the
    process's pid is the command's, so SIGTERM reaches it as it reaches PID 1 in a container."""

    def __init__(self, image: Image, command: list[str], log: Path, env: dict[str, str] | None = None,
                 models: Path | None = None):
        uid, gid, home = image.user()
        environment = {"HOME": home, **image.env, **(env or {})}
        root = shlex.quote(str(image.root))
        mounts = [
            f"mount -t proc proc {root}/proc",
            f"mount -t sysfs -o ro sysfs {root}/sys",
            f"mount -t tmpfs -o mode=1777 tmpfs {root}/tmp",
            f"mount -t tmpfs -o mode=755 tmpfs {root}/dev",
            *[f"touch {root}/dev/{d} && mount --bind /dev/{d} {root}/dev/{d}"
              for d in ("null", "zero", "random", "urandom")],
        ]
        if models is not None:
            mounts += [f"mount --bind {shlex.quote(str(models))} {root}/models",
                       f"mount -o remount,bind,ro {root}/models"]
        start = ["chroot", f"--userspec={uid}:{gid}", str(image.root), "/usr/bin/env", "-i",
                 "-C", image.config.get("WorkingDir") or "/", *[f"{k}={v}" for k, v in environment.items()], *command]
        script = " && ".join([*mounts, "exec " + shlex.join(start)])
        self.log = log
        with open(log, "ab") as out:
            self.process = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "--",
                                             "sh", "-c", script], stdout=out, stderr=subprocess.STDOUT)

    def wait(self, timeout: float) -> int:
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired as error:
            self.process.kill()
            self.process.wait()
            raise AssertionError(f"{self.process.args} still running after {timeout} s:\n{tail(self.log)}") from error

    def terminate(self, timeout: float) -> tuple[int, float]:
        """SIGTERM, then (exit code, seconds until exit); killed and failed if it outlives `timeout`."""
        started = time.monotonic()
        self.process.send_signal(signal.SIGTERM)
        code = self.wait(timeout)
        return code, time.monotonic() - started

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def run_in(image: Image, command: list[str], log: Path, timeout: float = 120, **kwargs) -> tuple[int, str]:
    """Runs `command` in the image to completion: (exit code, its output)."""
    log.unlink(missing_ok=True)
    container = Container(image, command, log, **kwargs)
    code = container.wait(timeout)
    return code, log.read_text(errors="replace")


def healthcheck_command(image: Image) -> tuple[list[str], float]:
    """The image's HEALTHCHECK as a command line, and its timeout in seconds."""
    check = image.healthcheck
    assert check and check.get("Test"), f"{image.tag} has no HEALTHCHECK"
    kind, *rest = check["Test"]
    command = rest if kind == "CMD" else ["/bin/sh", "-c", *rest]
    assert kind in ("CMD", "CMD-SHELL"), check
    return command, check.get("Timeout", 30 * 10**9) / 1e9
