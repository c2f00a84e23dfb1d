"""`linnet serve --ray`'s options: what cannot run is refused with one line and exit 2 before anything loads or Ray
starts (`--replicas 0`, Ray options without `--ray`, `--ray` where Ray Serve is not installed); the `serve run`
builder (`linnet.cli.serve_ray:build`) takes docs/serving-scale-out.md's Serve config as written."""

from __future__ import annotations

import importlib.util
import re
import socket
import sys

import pytest

from linnet.cli import main
from tests.conftest import ROOT

DOC = ROOT / "docs" / "serving-scale-out.md"


def _one_error_line(err: str) -> str:
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.startswith("linnet serve:")]
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--ray", "--replicas", "0"], "--replicas must be >= 1, got 0"),
        (["--ray", "--cpus-per-replica", "0"], "--cpus-per-replica must be > 0"),
        (["--replicas", "2"], "--replicas is an option of Ray Serve: add --ray"),
        (["--ray-address", "auto"], "--ray-address is an option of Ray Serve: add --ray"),
    ],
)
def test_bad_ray_options_are_usage_errors(args, says, capsys):
    assert main(["serve", *args]) == 2
    assert says in _one_error_line(capsys.readouterr().err)


def test_ray_without_ray_installed_is_a_usage_error_naming_the_extra(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError, as where it is not installed
    monkeypatch.delitem(sys.modules, "linnet.runtimes.serve.ray_deployment", raising=False)
    assert main(["serve", "--ray", "--replicas", "2"]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert "--ray needs Ray Serve, which is not installed" in line and "pip install 'linnet[ray]'" in line


def test_a_file_that_cannot_be_read_is_refused_before_ray_starts(tmp_path, capsys):
    if importlib.util.find_spec("ray") is None:
        pytest.skip("Ray Serve is not installed (pip install 'linnet[ray]')")
    missing = tmp_path / "missing.linnet"
    assert main(["serve", str(missing), "--weights", "smollm2-135m-instruct", "--ray"]) == 2
    assert "No such file or directory" in _one_error_line(capsys.readouterr().err)


def test_a_ray_address_where_no_cluster_answers_is_one_error(capsys):
    if importlib.util.find_spec("ray") is None:
        pytest.skip("Ray Serve is not installed (pip install 'linnet[ray]')")
    with socket.socket() as s:  # a port nothing listens on once closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = ["serve", "--weights", "smollm2-135m-instruct", "--ray", "--ray-address", f"127.0.0.1:{port}"]
    assert main(args) == 1
    assert f"no Ray cluster answers at 127.0.0.1:{port}" in _one_error_line(capsys.readouterr().err)


def test_a_port_in_use_is_one_error_before_ray_starts(capsys):
    if importlib.util.find_spec("ray") is None:
        pytest.skip("Ray Serve is not installed (pip install 'linnet[ray]')")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert main(["serve", "--weights", "smollm2-135m-instruct", "--ray", "--port", str(port)]) == 1
    assert f"cannot listen on 127.0.0.1:{port}" in _one_error_line(capsys.readouterr().err)


def _documented_serve_config() -> dict:
    yaml = pytest.importorskip("yaml")
    block = re.search(r"```yaml\n(.*?)```", DOC.read_text(), re.S)
    assert block, f"{DOC} has no ```yaml block"
    return yaml.safe_load(block.group(1))


def test_the_documented_serve_config_is_valid_and_builds():
    if importlib.util.find_spec("ray") is None:
        pytest.skip("Ray Serve is not installed (pip install 'linnet[ray]')")
    from ray import serve
    from ray.serve.schema import ServeDeploySchema

    from linnet.cli.serve_ray import build

    config = _documented_serve_config()
    ServeDeploySchema.model_validate(config)  # what `serve run`/`serve deploy` check the file against
    (app,) = config["applications"]
    assert app["import_path"] == "linnet.cli.serve_ray:build"
    assert isinstance(build(app["args"]), serve.Application)


def test_the_serve_run_builder_refuses_what_linnet_serve_refuses():
    if importlib.util.find_spec("ray") is None:
        pytest.skip("Ray Serve is not installed (pip install 'linnet[ray]')")
    from linnet.cli.common import UsageError
    from linnet.cli.serve_ray import build

    with pytest.raises(UsageError, match="--replicas must be >= 1, got 0"):
        build({"replicas": 0})
    with pytest.raises(UsageError, match="linnet serve refuses these options"):
        build({"no_such_option": 1})
