"""Notebook parameters: read, merged and checked before anything runs.

Values come from a profile (``params/<cpu|cuda|rocm>.yaml``), an optional
``--params FILE`` and ``-p NAME=VALUE`` overrides, in that order, and are judged
against the notebook specs (``specs.py``): an unknown name, a value of the wrong
type, a value its rule refuses (an empty list, a number out of range, an unknown
variant name, a GPU-only mode for a CPU device) or parameters that cannot work
together are errors naming each problem. ``run`` and ``submit`` call the same
``resolve_parameters`` with the device kind they run on; ``run`` also checks that
every variant named runs on this machine (``check_variants_run_here``): one the
user named (``--params``, ``-p``) that cannot load here is refused, one only the
device profile names is skipped with its reason (``without_skipped``), so the
profile written for a fully equipped node still runs where some peer cannot load.

YAML is read with PyYAML's safe loader, at most ``MAX_YAML_BYTES`` per file or
value and without anchors or aliases (a few hundred bytes of nested aliases
expand to gigabytes).
"""

from __future__ import annotations

import ast
import json
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path

import yaml

from rope_kernels.study.specs import NOTEBOOKS, RUNNER_PARAMS, SPECS, NotebookSpec

# Parameters are lists of lists at most (shapes, families): deeper nesting is a mistake
# or an attack on the parser's recursion.
MAX_YAML_DEPTH = 32
MAX_YAML_BYTES = 64 * 1024  # the profiles are a few KB


class ParameterError(ValueError):
    """A parameter the notebooks do not declare, or a value they cannot take."""


def _raise_all(errors: Sequence[str], what: str) -> None:
    """Nothing where ``errors`` is empty; else one ParameterError: a lone error as it is,
    several counted under ``what`` ("3 invalid parameters:"), one a line."""
    if len(errors) == 1:
        raise ParameterError(errors[0])
    if errors:
        raise ParameterError(f"{len(errors)} {what}:\n  " + "\n  ".join(errors))


def notebook_parameters(path: Path) -> dict[str, object]:
    """Name -> default of the cell tagged ``parameters`` (literal assignments only).
    Reads the notebook's JSON directly (nbformat's import alone takes about a second)."""
    nb = json.loads(Path(path).read_text(encoding="utf-8"))
    for cell in nb.get("cells", []):
        if cell.get("cell_type") == "code" and "parameters" in cell.get("metadata", {}).get("tags", []):
            source = cell.get("source", "")
            source = "".join(source) if isinstance(source, list) else source
            params = {}
            for node in ast.parse(source).body:
                if isinstance(node, ast.Assign) and len(node.targets) == 1 and \
                        isinstance(node.targets[0], ast.Name):
                    params[node.targets[0].id] = ast.literal_eval(node.value)
            return params
    raise ParameterError(f"{Path(path).name} has no cell tagged 'parameters'")


def _type_ok(value, default) -> bool:
    if default is None:
        return True
    if isinstance(default, bool):
        return isinstance(value, bool)
    if isinstance(default, int):
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(default, float):
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, type(default))


def _type_name(default) -> str:
    return "any" if default is None else type(default).__name__


def value_problem(notebook: str, name: str, value, kind: str | None) -> str | None:
    """What is wrong with ``value`` for ``notebook.name`` on a ``kind`` device, or None."""
    param = SPECS[notebook].parameters.get(name)
    return param.rule(value, kind) if param is not None and param.rule else None


# -- YAML ------------------------------------------------------------------------------
def _yaml_problem(exc: yaml.YAMLError) -> str:
    """A YAML error on one line: what is wrong, and where."""
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    mark = getattr(exc, "problem_mark", None)
    where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
    context = getattr(exc, "context", None)
    return f"{context + ': ' if context else ''}{problem}{where}"


def safe_yaml(text: str, what: str):
    """Parse ``text`` (a parameter file or one -p value) as plain YAML data: at most
    ``MAX_YAML_BYTES``, no anchors or aliases, safe tags only. ParameterError
    names ``what`` and the problem."""
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_YAML_BYTES:
        raise ParameterError(f"{what}: {size} bytes of YAML, more than the {MAX_YAML_BYTES} "
                             "a parameter file may hold")
    depth = 0
    try:
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            if isinstance(event, yaml.CollectionStartEvent):
                depth += 1
                if depth > MAX_YAML_DEPTH:
                    mark = event.start_mark
                    raise ParameterError(f"{what}: YAML nested more than {MAX_YAML_DEPTH} "
                                         f"levels deep (line {mark.line + 1}, column "
                                         f"{mark.column + 1}); no parameter needs that")
            elif isinstance(event, yaml.CollectionEndEvent):
                depth -= 1
            if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
                mark = event.start_mark
                raise ParameterError(f"{what}: YAML anchors and aliases are not accepted (line "
                                     f"{mark.line + 1}, column {mark.column + 1}); write values out")
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ParameterError(f"{what}: not valid YAML: {_yaml_problem(exc)}") from None
    except RecursionError:  # a parser's own recursion, whatever the depth above allowed
        raise ParameterError(f"{what}: YAML nested too deeply to read") from None


def parse_override(text: str) -> tuple[str | None, str, object]:
    """'NAME=VALUE' or 'NOTEBOOK.NAME=VALUE'; VALUE is YAML (numbers, lists, ...)."""
    if "=" not in text:
        raise ParameterError(f"-p wants NAME=VALUE, got {text!r}")
    key, raw = text.split("=", 1)
    notebook, _, name = key.strip().rpartition(".")
    if not name.isidentifier():
        raise ParameterError(f"-p: {name!r} is not a parameter name")
    try:
        value = safe_yaml(raw, f"-p {key}")
    except ParameterError as exc:
        raise ParameterError(f"{exc} (value {raw[:80]!r})") from None
    return (notebook or None), name, value


def load_profile(path: Path) -> dict:
    """A params YAML: ``common:`` for every notebook, then one mapping per notebook."""
    path = Path(path)
    if not path.exists():
        raise ParameterError(f"parameter file {path} does not exist")
    if not path.is_file():
        raise ParameterError(f"parameter file {path} is not a file")
    try:
        size = path.stat().st_size
        if size > MAX_YAML_BYTES:
            raise ParameterError(f"{path}: {size} bytes, more than the {MAX_YAML_BYTES} a "
                                 "parameter file may hold")
        with open(path, "rb") as fh:
            raw = fh.read(MAX_YAML_BYTES + 1)
        data = safe_yaml(raw.decode("utf-8"), str(path)) or {}
    except UnicodeDecodeError as exc:
        raise ParameterError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise ParameterError(f"parameter file {path}: {exc.strerror or exc}") from None
    if not isinstance(data, dict):
        raise ParameterError(f"{path}: expected a mapping of notebook -> parameters")
    for section, values in data.items():
        if section != "common" and section not in NOTEBOOKS:
            raise ParameterError(f"{path}: unknown section {section!r}; use 'common' or one of "
                                 f"{', '.join(NOTEBOOKS)}")
        if values is not None and not isinstance(values, dict):
            raise ParameterError(f"{path}: section {section!r} must be a mapping")
    return data


# -- merging and checking ----------------------------------------------------------------
def resolve_parameters(notebooks: Sequence[str], specs: Mapping[str, NotebookSpec] | None,
                       layers: Sequence[tuple[str, dict]], overrides: Sequence[str],
                       kind: str | None = None, *,
                       origins: dict[tuple[str, str], str] | None = None) -> dict[str, dict]:
    """Merge profile layers and overrides into per-notebook parameters (only the
    values given; the notebook's defaults fill the rest), checking every name, type
    and value against ``specs`` (default: ``specs.SPECS``), and each selected
    notebook's cross-parameter checks with its defaults filled in. ``kind`` is the
    device the notebooks will run on ('cpu' refuses GPU-only modes). Raises
    ParameterError naming every problem found. ``origins``, when given, is filled
    with (notebook, name) -> the layer name or ``-p`` text its final value came from."""
    specs = SPECS if specs is None else specs
    errors: list[str] = []
    resolved: dict[str, dict] = {nb: {} for nb in notebooks}
    origins = {} if origins is None else origins  # where each value came from, for messages

    def assign(scope: str | None, name: str, value, origin: str):
        if scope is not None and scope not in specs:
            errors.append(f"{origin}: unknown notebook {scope!r}")
            return
        if name in RUNNER_PARAMS:
            errors.append(f"{origin}: {name!r} is set by the runner, not by parameters")
            return
        # A name no notebook in scope declares is an error, whichever notebooks run; a
        # value is judged only for the notebooks selected (--only 04 -p samples=abc names
        # 04.samples alone).
        declared = [nb for nb in specs if scope in (None, nb) and name in specs[nb].parameters]
        if not declared:
            where = scope or "no notebook"
            errors.append(f"{origin}: {where} has no parameter {name!r}" if scope
                          else f"{origin}: {where} has a parameter {name!r}")
            return
        for nb in (nb for nb in declared if nb in resolved):
            default = specs[nb].parameters[name].default
            if not _type_ok(value, default):
                errors.append(f"{origin}: {nb}.{name} must be {_type_name(default)}, "
                              f"got {type(value).__name__} {value!r}")
                continue
            origins[nb, name] = origin
            if nb in resolved:
                resolved[nb][name] = value

    for layer_name, layer in layers:
        for section, values in (layer or {}).items():
            for name, value in (values or {}).items():
                assign(None if section == "common" else section, name, value, layer_name)
    for text in overrides:
        try:
            scope, name, value = parse_override(text)
        except ParameterError as exc:
            errors.append(str(exc))
            continue
        assign(scope, name, value, f"-p {text}")
    # Values are judged once every layer applied: a later layer may replace a value.
    for nb, values in resolved.items():
        bad = set()
        for name, value in values.items():
            param = specs[nb].parameters[name]
            problem = param.rule(value, kind) if param.rule else None
            if problem:
                bad.add(name)
                errors.append(f"{origins[nb, name]}: {nb}.{name} {problem}")
        if bad:
            continue
        merged = {**specs[nb].defaults, **values}
        for check in specs[nb].checks:
            problem = check(merged, kind)
            if problem:
                errors.append(f"{nb}: {problem}")
    _raise_all(errors, "invalid parameters")
    return resolved


def check_variants_run_here(params: Mapping[str, dict],
                            specs: Mapping[str, NotebookSpec] | None = None, *,
                            from_profile: Collection[tuple[str, str]] = (),
                            ) -> dict[str, dict[str, str]]:
    """Every variant named in a given value runs on this machine: a known peer that
    is absent here (its file not cached, its package not installed, no GPU) is
    refused with the registry's reason. Values whose (notebook, name) is in
    ``from_profile`` came from the device profile alone (``params/<kind>.yaml``,
    written for a node with every peer): their absent variants are not refused but
    returned, notebook -> {variant: reason}, for the runner to skip
    (``without_skipped``) and report. Builds the registry (loads the peers)."""
    specs = SPECS if specs is None else specs
    named = [(nb, name, v) for nb, values in params.items() for name, value in values.items()
             if specs[nb].parameters[name].variants for v in value]
    if not named:
        return {}
    from rope_kernels.variants import absent_reason
    from rope_kernels.vocabulary import ENCODER_ONLY_ROPE

    errors, skipped = [], {}
    for nb, name, variant in named:
        if variant in ENCODER_ONLY_ROPE:
            from rope_kernels.variants import encoder_only_absent

            reason = encoder_only_absent().get(variant, "")
        else:
            reason = absent_reason(variant)
        if reason and (nb, name) in from_profile:
            skipped.setdefault(nb, {})[variant] = reason
        elif reason:
            errors.append(f"{nb}.{name}: {variant} does not run here: {reason}")
    _raise_all(errors, "variants do not run here")
    return skipped


def without_skipped(params: Mapping[str, dict], skipped: Mapping[str, Mapping[str, str]],
                    specs: Mapping[str, NotebookSpec] | None = None) -> dict[str, dict]:
    """``params`` with the ``skipped`` variants (``check_variants_run_here``) taken out
    of every variant list. A list left empty is an error: an empty list means "every
    variant" to notebooks 01-03 and is refused by 04, neither of which the profile meant."""
    specs = SPECS if specs is None else specs
    out = {nb: dict(values) for nb, values in params.items()}
    for nb, gone in skipped.items():
        for name, value in params[nb].items():
            if not specs[nb].parameters[name].variants:
                continue
            kept = [v for v in value if v not in gone]
            if value and not kept:
                raise ParameterError(f"{nb}.{name}: none of the profile's variants runs here "
                                     f"({'; '.join(f'{v}: {why}' for v, why in gone.items())})")
            out[nb][name] = kept
    return out


def select_notebooks(only: Sequence[str] | None) -> list[str]:
    if not only:
        return list(NOTEBOOKS)
    chosen = []
    for item in only:
        stem = Path(item).stem
        matches = [nb for nb in NOTEBOOKS if nb == stem or nb.startswith(stem)]
        if len(matches) != 1:
            raise ParameterError(f"--only {item!r} matches {matches or 'no notebook'}; "
                                 f"choose from {', '.join(NOTEBOOKS)}")
        chosen.append(matches[0])
    return [nb for nb in NOTEBOOKS if nb in chosen]


def profile_layer(kind: str) -> str:
    """The name of a ``kind`` device's profile layer, as ``origins`` records it."""
    return f"params/{kind}.yaml"


def study_parameters(kind: str, *, root: Path, notebooks: Sequence[str],
                     params_file: Path | None = None, overrides: Sequence[str] = (),
                     origins: dict[tuple[str, str], str] | None = None) -> dict[str, dict]:
    """The layers ``run`` and ``submit`` both apply (``params/<kind>.yaml``, then
    ``params_file``, then ``overrides``), resolved for a ``kind`` device; ``origins``
    as ``resolve_parameters`` fills it."""
    layers = [(profile_layer(kind), load_profile(Path(root) / "params" / f"{kind}.yaml"))]
    if params_file is not None:
        layers.append((str(params_file), load_profile(Path(params_file))))
    return resolve_parameters(notebooks, SPECS, layers, overrides, kind, origins=origins)
