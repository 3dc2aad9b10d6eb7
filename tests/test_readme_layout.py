"""README for a newcomer (issue 48): quick start and a contents list on the first screen, a
guide to adding a variant naming files that exist, engine versions as pinned."""

import re
from pathlib import Path

from rope_kernels.peers.cache import PINS
from rope_kernels.study import findings as F
from rope_kernels.study import summaries as S

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
FIRST_SCREEN = 40  # lines


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_quick_start_and_contents_on_the_first_screen():
    lines = README.splitlines()
    first = "\n".join(lines[:FIRST_SCREEN])
    assert "**Contents:**" in first
    assert "## Quick start" in first
    assert README.index("## Quick start") < README.index(F.FINDINGS_BEGIN)
    assert README.index(S.README_END) < README.index("**Contents:**")  # the answer still opens it


def test_every_contents_link_names_a_heading():
    contents = README[README.index("**Contents:**"):README.index("## Quick start")]
    anchors = re.findall(r"\]\(#([\w-]+)\)", contents)
    headings = {_slug(h) for h in re.findall(r"^#{2,3} (.+)$", README, flags=re.MULTILINE)}
    assert len(anchors) >= 8
    assert set(anchors) <= headings, set(anchors) - headings


def test_add_a_variant_names_files_that_exist():
    start = README.index("## Add a kernel variant")
    section = README[start:README.index("\n## ", start + 1)]
    paths = set(re.findall(r"`((?:rope_kernels|tests)/[\w/.]+\.py)`", section))
    assert {"rope_kernels/catalogue.py", "rope_kernels/variants.py", "rope_kernels/peers/cache.py",
            "tests/test_catalogue.py"} <= paths
    missing = [p for p in paths if not (ROOT / p).is_file()]
    assert not missing, missing


def test_engine_versions_are_the_pinned_ones():
    for package, label in (("vllm", "vLLM"), ("sglang", "SGLang")):
        said = set(re.findall(rf"\b(?:{label}|{package}) (\d+\.\d+\.\d+)", README))
        assert said == {PINS[package].version}, (package, said)
