"""deploy/Dockerfile with the classic builder (`DOCKER_BUILDKIT=0 docker build`): no BuildKit-only syntax.

The compose test builds the image with BuildKit (compose's own builder); this builds it with the other one,
from the repository root as deploy/README.md says, on the base of `LTM_PYTHON_IMAGE` when set (else the
Dockerfile's default). It checks the context the classic builder sent (only what the builder stage copies: the
root .dockerignore), that nothing but the base was pulled, and that the image runs the worker as uid 10001.
The image, tagged for this run, is removed afterwards.
"""

from __future__ import annotations

import os
import re
import subprocess
import uuid

from tests.containers.compose import REPO
from tests.support.commands import run_timed
from worker.testing.images import PYTHON

BUILD_TIMEOUT = 900.0
#: pyproject.toml, README.md, contracts/ (without the TypeScript kit) and worker/: well under this
CONTEXT_LIMIT_BYTES = 5_000_000
UNITS = {"B": 1, "kB": 1e3, "KB": 1e3, "MB": 1e6, "GB": 1e9}


def test_the_classic_builder_builds_the_image_from_the_base_alone(docker_engine: None) -> None:
    tag = f"tomoribot-ltm-worker:classic-{uuid.uuid4().hex[:10]}"
    command = ["docker", "build", "-f", "deploy/Dockerfile", "-t", tag]
    if PYTHON.env_var in os.environ:
        command += ["--build-arg", f"PYTHON_IMAGE={PYTHON.resolve()}"]
    env = {**os.environ, "DOCKER_BUILDKIT": "0"}
    try:
        built, took = run_timed([*command, "."], cwd=REPO, env=env, timeout=BUILD_TIMEOUT)
        output = built.stdout + built.stderr
        assert built.returncode == 0, output[-6000:]
        print(f"\nclassic build of {tag} on {PYTHON.resolve()}: {took:.1f}s")

        # "Sending build context to Docker daemon  673.8kB"
        sent = re.search(r"Sending build context to Docker daemon\s+([0-9.]+)\s*([kKMG]?B)", output)
        assert sent, output[:2000]
        context = float(sent[1]) * UNITS[sent[2]]
        print(f"classic build context: {sent[1]}{sent[2]}")
        assert context < CONTEXT_LIMIT_BYTES, "the root .dockerignore lets more than the builder copies in"
        # the base may be pulled when it is not there yet ("<tag>: Pulling from library/python"), nothing else
        base = PYTHON.resolve().split("@")[0].rsplit(":", 1)[0]
        pulled = re.findall(r"Pulling from (\S+)", output)
        assert all(base.endswith(name.removeprefix("library/")) for name in pulled), (pulled, base)

        def in_image(*args: str) -> str:
            done = subprocess.run(
                ["docker", "run", "--rm", "--read-only", "--entrypoint", args[0], tag, *args[1:]],
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            assert done.returncode == 0, done.stdout + done.stderr
            return done.stdout

        assert in_image("id", "-u").strip() == "10001"
        assert in_image("worker", "--version").strip()
    finally:
        remove = ["docker", "image", "rm", "--force", tag]
        subprocess.run(remove, capture_output=True, timeout=120, check=False)
