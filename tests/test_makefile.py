"""The Makefile: every target it declares .PHONY has a rule (a phony name without one is a
`make NAME` that silently does nothing)."""

from __future__ import annotations

import re

from site_helpers import REPO


def phony_without_rule(makefile: str) -> list[str]:
    joined = makefile.replace("\\\n", " ")
    phony = [name for line in re.findall(r"^\.PHONY:(.*)$", joined, flags=re.M) for name in line.split()]
    rules = set(re.findall(r"^([A-Za-z0-9_.-]+)\s*:(?!=)", joined, flags=re.M))
    return [name for name in phony if name not in rules]


def test_every_phony_target_has_a_rule() -> None:
    assert phony_without_rule((REPO / "Makefile").read_text(encoding="utf-8")) == []


def test_a_phony_name_without_a_rule_is_found() -> None:
    makefile = ".PHONY: setup measure \\\n\tmeasure-import\nsetup: x\n\ttrue\nmeasure: setup\n\ttrue\nDB := y\n"
    assert phony_without_rule(makefile) == ["measure-import"]


def test_no_benchmark_script_shadows_a_module_the_libraries_look_for() -> None:
    """`make bench` runs benchmarks/*.py as scripts, so their folder comes first on sys.path: a
    script named like a module that a library probes for (transformers imports `kernels` when
    one is importable) is imported in its place. The model-loading imports a benchmark makes
    must succeed with that folder first."""
    import subprocess
    import sys

    probe = ("import sys; sys.path.insert(0, sys.argv[1]); "
             "import torch, huggingface_hub, safetensors; from transformers.modeling_layers import MtpModel")
    done = subprocess.run([sys.executable, "-c", probe, str(REPO / "benchmarks")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
