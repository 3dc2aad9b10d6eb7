"""`make lab`: JupyterLab serves the study's notebooks on loopback."""

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str):
    with urllib.request.urlopen(url, timeout=10) as resp:
        return resp.status, resp.read()


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    pytest.importorskip("jupyterlab")
    port, token = _free_port(), "rope-study-test-token"
    runtime = tmp_path_factory.mktemp("jupyter-runtime")
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(runtime)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--ServerApp.ip=127.0.0.1",
         f"--ServerApp.port={port}", f"--IdentityProvider.token={token}",
         f"--ServerApp.root_dir={ROOT / 'notebooks'}", "--ServerApp.port_retries=0",
         *(["--allow-root"] if os.geteuid() == 0 else [])],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while True:
        try:
            _get(f"{base}/api/status?token={token}")
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail("JupyterLab did not start: " + proc.stderr.read().decode()[-2000:])
            time.sleep(0.5)
    yield base, token
    proc.terminate()
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()


def test_lab_lists_and_serves_the_notebooks(lab):
    base, token = lab
    status, body = _get(f"{base}/api/contents?token={token}")
    names = {item["name"] for item in json.loads(body)["content"]}
    assert {"01_kernels.ipynb", "02_microbench.ipynb", "03_profile.ipynb", "04_ttft.ipynb", "05_qkv_gemm.ipynb",
            "06_summary.ipynb"} <= names
    status, body = _get(f"{base}/api/contents/02_microbench.ipynb?token={token}")
    cells = json.loads(body)["content"]["cells"]
    assert "parameters" in cells[0]["metadata"]["tags"]  # parameters on top
    status, page = _get(f"{base}/lab?token={token}")
    assert status == 200 and b"JupyterLab" in page


def test_lab_offers_the_study_kernel(lab):
    base, token = lab
    spec_dir = Path(sys.prefix) / "share" / "jupyter" / "kernels" / "rope-study"
    if not spec_dir.exists():
        pytest.skip("kernel not registered in this environment (the Makefile's venv registers it)")
    _, body = _get(f"{base}/api/kernelspecs?token={token}")
    specs = json.loads(body)["kernelspecs"]
    assert specs["rope-study"]["spec"]["display_name"] == "Python (rope-study)"
