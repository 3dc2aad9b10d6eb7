"""``python -m rope_kernels run``: every notebook, this device, one command (the
orchestration: parameters are ``parameters.py``'s, executing a notebook is
``execution.py``'s).

Parameters come from a profile (``params/<cpu|cuda|rocm>.yaml``), an optional
``--params FILE`` and ``-p NAME=VALUE`` overrides, in that order. They are all
checked against the notebook specs (``specs.py``, by ``parameters.py``) before
anything runs: an unknown name, a value of the wrong type or out of range, a
variant named with ``--params``/``-p`` that does not run here, is an error that
names it (papermill itself would only warn), and nothing is written. A variant only
the profile names that cannot load here (a GPU peer whose package is not installed,
a CUDA-only one on ROCm) is skipped: its reason is printed before the run and again
at its end, and stated at the top of that notebook's report. Executed notebooks and HTML go
to ``reports/<device>/``, data to ``data/<device>/``; each file is replaced
atomically, so a crash leaves the previous results intact.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path

from rope_kernels.study.devices import (REPO_ROOT, device_kind, device_name, device_slug,  # noqa: F401
                                        resolve_device)
# Executing one notebook (papermill, its kernel, the terminal line) is execution.py's job.
from rope_kernels.study.execution import (  # noqa: F401
    ProgressLine,
    execute_notebook,
    kernel_sees_repo,
)

# Parameters: specs.py says what each notebook takes, parameters.py reads and checks values.
from rope_kernels.study.parameters import (  # noqa: F401
    ParameterError,
    check_variants_run_here,
    load_profile,
    profile_layer,
    notebook_parameters,
    parse_override,
    resolve_parameters,
    select_notebooks,
    study_parameters,
    value_problem,
    without_skipped,
)
from rope_kernels.study.specs import NOTEBOOKS, RUNNER_PARAMS, SPECS, SUMMARY_NOTEBOOK  # noqa: F401


class NotebookError(RuntimeError):
    """A notebook cell raised; its partial output is kept as <notebook>.failed.ipynb."""


def skip_lines(skipped: dict[str, dict[str, str]], kind: str) -> list[str]:
    """One terminal line per variant the run skips (``check_variants_run_here``)."""
    return [f"{nb}: skipped {variant} ({profile_layer(kind)} names it; it does not run here: "
            f"{reason})" for nb, reasons in skipped.items() for variant, reason in reasons.items()]


def skip_note(reasons: dict[str, str], kind: str) -> str | None:
    """The Markdown note a report opens with when the run skipped some of the
    profile's variants; None when it skipped none. Host paths are scrubbed, as in
    the cell outputs."""
    if not reasons:
        return None
    import html

    from rope_kernels.study.reports import scrub_host_paths

    items = "\n".join(f"- `{variant}`: {html.escape(scrub_host_paths(reason))}"
                      for variant, reason in reasons.items())
    return (f"**Skipped by this run.** `{profile_layer(kind)}` names these variants, which "
            f"cannot load on this machine; the run went on without them:\n\n{items}")


def check_sizes_fit(params: dict[str, dict], kind: str) -> None:
    """Refuse, before anything runs, a notebook whose working set (``bounds.working_set``,
    estimated from its parameters) is over the memory of the device it would run on."""
    from rope_kernels.study.bounds import device_memory_bytes, memory_problems

    memory = device_memory_bytes(kind)
    problems = memory_problems(params, *memory) if memory is not None else []
    if len(problems) == 1:
        raise ParameterError(problems[0])
    if problems:
        raise ParameterError(f"{len(problems)} runs cannot fit:\n  " + "\n  ".join(problems))


def run_study(*, device: str = "auto", params_file: Path | None = None,
              overrides: Sequence[str] = (), only: Sequence[str] | None = None,
              keep_inputs: bool = False, root: Path = REPO_ROOT, kernel_name: str | None = None,
              verbose: bool = False, log=print) -> list[Path]:
    """Run the notebooks; returns the HTML reports written. One line per notebook
    (a live progress line on a terminal); ``verbose`` streams every cell's output."""
    root = Path(root)
    kind = resolve_device(device)
    if kind == "cpu":
        # Kernels inherit this: Triton picks interpreter or compiler when a @triton.jit is
        # defined, and a notebook imports triton (its own standard library of jitted helpers)
        # before rope_kernels could decide for it.
        os.environ.setdefault("TRITON_INTERPRET", "1")
    notebooks = select_notebooks(only)
    origins: dict[tuple[str, str], str] = {}
    params = study_parameters(kind, root=root, notebooks=notebooks, params_file=params_file,
                              overrides=overrides, origins=origins)
    from_profile = {key for key, origin in origins.items() if origin == profile_layer(kind)}
    check_sizes_fit(params, kind)  # before the registry loads the peers: a quick refusal
    skipped = check_variants_run_here(params, from_profile=from_profile)
    params = without_skipped(params, skipped)
    for line in skip_lines(skipped, kind):
        log(line)
    from papermill.exceptions import PapermillExecutionError  # a cell raised

    slug = device_slug(device_name(kind))
    data_dir = root / "data" / slug
    report_dir = root / "reports" / slug
    written = []
    from rope_kernels.study.reports import build_index, notebook_to_html
    from rope_kernels.study.results import (check_result_files, check_writable_folder, run_lock,
                                            sweep_temp_files)

    for folder in (data_dir, report_dir):
        check_writable_folder(folder)  # before any notebook runs, one line if not
    # a damaged file the notebooks will upsert into: refused now, not after the measurements
    check_result_files(data_dir, [name for nb in notebooks for name in SPECS[nb].writes])

    # Runs may share a device folder (job-array tasks; result files lock per write).
    # Only a run that finds no other sweeps what killed runs left behind.
    def sweep():
        for folder in (data_dir, report_dir, report_dir / "traces"):
            sweep_temp_files(folder)

    with run_lock(report_dir / ".run", when_alone=sweep):
        for i, nb in enumerate(notebooks, 1):
            nb_params = dict(params[nb])
            for name, value in (("device", kind), ("data_dir", str(data_dir)),
                                ("report_dir", str(report_dir)), ("device_folders", "all")):
                if name in SPECS[nb].parameters:
                    nb_params[name] = value
            label = f"[{i}/{len(notebooks)}] {nb}"
            start = time.monotonic()
            with ProgressLine(label, verbose=verbose) as progress:
                try:
                    executed = execute_notebook(root / "notebooks" / f"{nb}.ipynb",
                                                report_dir / f"{nb}.ipynb", nb_params,
                                                cwd=root / "notebooks", kernel_name=kernel_name,
                                                verbose=verbose, progress=progress,
                                                note=skip_note(skipped.get(nb, {}), kind))
                except PapermillExecutionError as exc:
                    message = (str(exc.evalue).strip().splitlines() or [""])[-1]
                    failed = (report_dir / f"{nb}.failed.ipynb").relative_to(root)
                    raise NotebookError(f"{nb} failed: {exc.ename}: {message} (its output so "
                                        f"far: {failed}; --verbose shows every cell)") from None
                written.append(notebook_to_html(executed, report_dir / f"{nb}.html",
                                                hide_inputs=not keep_inputs))
            log(f"{label} done in {time.monotonic() - start:.0f} s -> "
                f"{written[-1].relative_to(root)}")
    index = build_index(root)
    for line in skip_lines(skipped, kind):
        log(line)
    log(f"reports/index.html lists the committed devices (unchanged by this run unless "
        f"{slug}'s results are tracked), reports/local.html every device on disk, this run's too; "
        f"this run's summary: "
        f"{(report_dir / f'{SUMMARY_NOTEBOOK}.html').relative_to(root)}"
        if SUMMARY_NOTEBOOK in notebooks else f"index: {index.relative_to(root)}")
    return written
