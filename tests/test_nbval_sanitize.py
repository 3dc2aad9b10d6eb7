"""The notebooks' stored outputs (nbval) do not depend on the torch build: version strings'
widths and library log lines that are not the study's (issue 48)."""

import logging
import re
from pathlib import Path

import pandas as pd
import pytest

from rope_kernels.study.notebooks import QUIET_LOGGERS, report_display

nbval_plugin = pytest.importorskip("nbval.plugin")

CFG = Path(__file__).resolve().parent.parent / "notebooks" / "nbval_sanitize.cfg"


def sanitize(text: str) -> str:
    """What nbval does to a stored and a fresh output before comparing them."""
    for regex, replace in nbval_plugin.get_sanitize_patterns(CFG.read_text()):
        text = re.sub(regex, replace, text)
    return text


def test_nbval_reads_every_rule():
    # nbval reads "regex: X" + "replace: Y" only; a "replace:" without its space was dropped
    sections = re.findall(r"^\[(\w+)\]$", CFG.read_text(), flags=re.MULTILINE)
    assert len(nbval_plugin.get_sanitize_patterns(CFG.read_text())) == len(sections), sections


def test_empty_replacement_removes_the_line():
    assert sanitize("a\nUSDT: probe foo\nb\n") == "a\nb\n"


def _launch_table(torch_version: str) -> str:
    """A table like 03's launches: a torch version in one row sets its column's width."""
    frame = pd.DataFrame({
        "variant": ["native", "vllm_packed_qk", "compiled"],
        "launches [per call]": [6.0, 1.0, float("nan")],
        "peer_package": ["", "vllm", "torch"],
        "peer_version": ["", "0.34.0", torch_version],
        "peer_sha256": ["", "f712a22da06f28cc088d6f231b2107fe4a6dd9d8f93c2b1d3c48f7c85f5f38cc", ""],
    })
    keys = ("display.width", "display.max_columns", "display.max_rows", "display.max_colwidth",
            "display.expand_frame_repr")
    with pd.option_context(*[x for k in keys for x in (k, pd.get_option(k))]):  # restored after
        report_display()
        with pd.option_context("display.width", 80):  # narrow: where would pandas wrap?
            return repr(frame)


@pytest.mark.parametrize("other", ["2.13.0", "2.15.0+cu132", "2.14.1+cu130"])
def test_a_table_reads_the_same_with_another_torch_build(other):
    stored = _launch_table("2.13.0+cpu")
    fresh = _launch_table(other)
    assert stored != fresh  # the widths differ ...
    assert sanitize(stored) == sanitize(fresh)  # ... the comparison does not see them


def test_padding_rule_still_sees_values():
    assert sanitize(_launch_table("2.13.0+cpu")) != sanitize(_launch_table("2.13.0+cpu").replace("vllm", "sgl"))


def test_torch_cuda_home_line_is_silenced():
    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    logger = logging.getLogger("torch.utils.cpp_extension")
    assert logger.name in QUIET_LOGGERS
    level = logger.level
    handler = Keep()
    logger.addHandler(handler)
    try:
        report_display()
        logger.warning("No CUDA runtime is found, using CUDA_HOME='%s'", "/usr/local/cuda")
        logger.error("a real error still shows")
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    assert records == ["a real error still shows"]
