"""Offline: the container images are named in one place (worker/testing/images.py) and every file agrees.

deploy/compose.yaml writes each image as `${LTM_<SERVICE>_IMAGE:-<default>}`, deploy/Dockerfile takes its base
from `ARG PYTHON_IMAGE=<default>`, and deploy/README.md names the variables and the pinned tags: all of them
must carry exactly the defaults and variable names of worker/testing/images.py. The Dockerfile must build with
the classic builder too (no BuildKit-only syntax), and the classic builder's context file must be BuildKit's.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from worker.testing.images import IMAGES, POSTGRES, PYTHON, RABBITMQ, REDIS, Image

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
#: compose's `${NAME:-default}` (the default may itself hold colons: `postgres:16.6`)
DEFAULTED = re.compile(r"^\$\{(?P<name>[A-Z_][A-Z0-9_]*):-(?P<default>[^}]*)\}$")


def compose() -> dict[str, Any]:
    return yaml.safe_load((DEPLOY / "compose.yaml").read_text(encoding="utf-8"))  # type: ignore[no-any-return]


def defaulted(value: str) -> tuple[str, str]:
    """(variable, default) of a compose value written `${VARIABLE:-default}`; fails on anything else."""
    match = DEFAULTED.match(value)
    assert match, f"{value!r} is not of the form ${{VARIABLE:-default}}"
    return match["name"], match["default"]


def dockerfile_lines() -> list[str]:
    return (DEPLOY / "Dockerfile").read_text(encoding="utf-8").splitlines()


@pytest.mark.parametrize(
    ("service", "image"), [("postgres", POSTGRES), ("rabbitmq", RABBITMQ), ("redis", REDIS)]
)
def test_compose_runs_the_pinned_image_overridable_by_its_variable(service: str, image: Image) -> None:
    assert defaulted(compose()["services"][service]["image"]) == (image.env_var, image.default)


def test_compose_builds_the_worker_on_the_pinned_python_image() -> None:
    services = compose()["services"]
    for name in ("migrate", "worker"):
        args = services[name]["build"]["args"]
        assert defaulted(args["PYTHON_IMAGE"]) == (PYTHON.env_var, PYTHON.default), name
        # pip's mirror settings are passed on from the environment only when set (a null value in compose)
        assert {key: args[key] for key in args if key.startswith("PIP_")} == {
            "PIP_INDEX_URL": None,
            "PIP_EXTRA_INDEX_URL": None,
            "PIP_TRUSTED_HOST": None,
        }
    assert services["migrate"]["image"] == services["worker"]["image"]
    assert defaulted(services["worker"]["image"]) == ("LTM_WORKER_IMAGE", "tomoribot-ltm-worker:dev")


def test_every_published_port_is_on_loopback_and_configurable() -> None:
    published = {}
    for name, service in compose()["services"].items():
        for port in service.get("ports", []):
            address, rest = port.split(":", 1)
            host_port, container_port = rest.rsplit(":", 1)
            assert address == "127.0.0.1", f"{name} publishes {port} beyond loopback"
            variable, default = defaulted(host_port)
            published[variable] = (default, container_port)
    assert published == {
        "LTM_RABBITMQ_HOST_PORT": ("5672", "5672"),
        "LTM_RABBITMQ_MANAGEMENT_HOST_PORT": ("15672", "15672"),
        "LTM_POSTGRES_HOST_PORT": ("5432", "5432"),
        "LTM_REDIS_HOST_PORT": ("6379", "6379"),
    }


def test_the_dockerfile_takes_its_base_from_python_image_with_the_pinned_default() -> None:
    lines = dockerfile_lines()
    froms = [line.split()[1] for line in lines if line.startswith("FROM ")]
    assert froms == ["${PYTHON_IMAGE}", "${PYTHON_IMAGE}"]
    first_from = next(i for i, line in enumerate(lines) if line.startswith("FROM "))
    global_args = [line for line in lines[:first_from] if line.startswith("ARG ")]
    assert global_args == [f"ARG PYTHON_IMAGE={PYTHON.default}"]


def test_the_dockerfile_builds_without_buildkit() -> None:
    """Nothing that makes BuildKit pull a frontend, nothing the classic builder (DOCKER_BUILDKIT=0) lacks."""
    lines = dockerfile_lines()
    # parser directives: only comments before the first instruction can be, `syntax` among them
    directives = lines[: next(i for i, line in enumerate(lines) if not line.startswith("#"))]
    assert not [line for line in directives if re.match(r"#\s*[a-z]+\s*=", line, flags=re.IGNORECASE)]
    instructions = "\n".join(line for line in lines if not line.lstrip().startswith("#"))
    assert "--mount" not in instructions
    assert "<<" not in instructions, "heredocs are BuildKit-only"
    for line in dockerfile_lines():
        if line.startswith(("COPY ", "ADD ")):
            # --from and --chown are classic; --link, --chmod (before 25.0), --parents, --exclude are not
            flags = [word for word in line.split()[1:] if word.startswith("--")]
            assert all(flag.startswith(("--from=", "--chown=")) for flag in flags), line


def ignore_patterns(path: Path) -> list[str]:
    lines = path.read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def test_the_classic_builder_sends_the_same_context_as_buildkit() -> None:
    """BuildKit reads deploy/Dockerfile.dockerignore; the classic builder only the root .dockerignore."""
    buildkit = ignore_patterns(DEPLOY / "Dockerfile.dockerignore")
    assert buildkit[0] == "*", "the context starts from nothing"
    assert ignore_patterns(REPO / ".dockerignore") == buildkit


def test_the_deploy_readme_names_every_variable_and_pinned_tag() -> None:
    readme = (DEPLOY / "README.md").read_text(encoding="utf-8")
    for image in IMAGES:
        row = f"| {image.service} | `{image.default}` | `{image.env_var}` |"
        assert row in readme, f"deploy/README.md lacks the row {row}"
