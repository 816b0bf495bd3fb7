"""Issue 40 §5: every option and prompt-set fault of `atlas measure run` that used to surface only
after the whole run was measured (a traceback as the record was built, no record written) is one
line before any model loads; a prompt-set file is accepted, identified by its sha256 in the record
and the export; the record folder filling up during the run still keeps the record."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from atlas.checkpoints.oracles import write_checkpoint
from atlas.cli import cli
from atlas.engines import options as run_options
from atlas.records import record as records
from atlas.records.workloads import MAX_FILE_BYTES, PROMPT_SETS

TINY = ["--temperatures", "0", "--draft-tokens", "1", "--max-new-tokens", "8", "--repeats", "1",
        "--prompts-per-workload", "1", "--no-peer"]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_checkpoint("mimo", tmp_path_factory.mktemp("ckpt") / "oracle", "oracle", depth=2)


def measure(model: Path, out: Path, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["measure", "run", "--model", str(model), "--out", str(out), *args])
    return result.exit_code, result.output


def refused_before_loading(code: int, out: str, words: str) -> None:
    """Exit 1, one line holding `words`, and the run never got to loading the model."""
    lines = out.strip().splitlines()
    assert code == 1 and len(lines) == 1 and "loading" not in out, out
    assert lines[0].startswith("Error: ") and words in lines[0], out


def _set(workloads: list[dict], name: str = "my-set") -> dict:
    return {"name": name, "description": "test prompts", "workloads": workloads}


GOOD = _set([{"name": "lines", "entropy": "low", "prompts": ["1,2,3,4,5,6,7,8,9,10,11,12,13,14"]},
             {"name": "words", "entropy": "mid", "prompts": ["the quick brown fox jumps over the lazy dog"]}])


# ---- options ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("args, words", [
    (["--workloads", "templated,templated"], "--workloads lists 'templated' twice"),
    (["--temperatures", "nan"], "--temperatures: nan is not a temperature a record holds (0 to 10)"),
    (["--temperatures", "inf"], "--temperatures: inf is not a temperature a record holds"),
    (["--temperatures", "100"], "--temperatures: 100 is not a temperature a record holds (0 to 10)"),
    (["--temperatures", "0,0"], "--temperatures lists 0 twice"),
    (["--draft-tokens", "1000"], "--draft-tokens: 1000 is not a draft length a record holds (1 to 64)"),
    (["--draft-tokens", "2,2"], "--draft-tokens lists 2 twice"),
])
def test_an_option_no_record_can_hold_is_refused_before_the_model_loads(model: Path, tmp_path: Path, args: list[str],
                                                                       words: str) -> None:
    code, out = measure(model, tmp_path / "out", *TINY, *args)  # the case's option, given last, wins
    refused_before_loading(code, out, words)
    assert not list((tmp_path / "out").glob("*.json"))


def test_a_full_disk_is_refused_before_the_model_loads(model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "out"
    plain_write = os.write

    def full(fd: int, data: bytes) -> int:  # the disk of --out is full: the probe's write fails as the kernel says
        if Path(os.readlink(f"/proc/self/fd/{fd}")).parent == out:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return plain_write(fd, data)

    monkeypatch.setattr(os, "write", full)
    code, text = measure(model, out, *TINY)
    refused_before_loading(code, text, f"--out {out}: the disk is full (No space left on device)")
    assert list(out.iterdir()) == []  # the probe is gone


def test_too_little_room_is_refused_before_the_model_loads(model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    usage = shutil.disk_usage

    def nearly_full(path: object) -> object:
        real = usage(path)
        return type(real)(real.total, real.total - 1024, 1024)

    monkeypatch.setattr(shutil, "disk_usage", nearly_full)
    code, text = measure(model, tmp_path / "out", *TINY)
    refused_before_loading(code, text, "only 0.0 MiB free, and a run needs 16 MiB there for its record")


def test_an_out_under_a_file_is_refused_before_the_model_loads(model: Path, tmp_path: Path) -> None:
    (tmp_path / "taken").write_text("a user's file")
    code, text = measure(model, tmp_path / "taken" / "records", *TINY)
    refused_before_loading(code, text, f"--out {tmp_path / 'taken' / 'records'}: cannot write there (Not a directory)")
    assert (tmp_path / "taken").read_text() == "a user's file"


def test_a_disk_that_fills_during_the_run_keeps_the_record_elsewhere(model: Path, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The probe passed, then the disk filled while the model ran: the record is saved whole in the
    temporary folder and one line says where."""
    out = tmp_path / "out"
    aside = tmp_path / "tmp"
    monkeypatch.setattr("tempfile.tempdir", str(aside))
    plain_fsync = os.fsync

    def full_for_records(fd: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}").endswith(".json.partial") and Path(os.readlink(f"/proc/self/fd/{fd}")).parent == out:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        plain_fsync(fd)

    monkeypatch.setattr(os, "fsync", full_for_records)
    code, text = measure(model, out, "--workloads", "templated", *TINY)
    assert code == 1 and "loading" in text, text
    (saved,) = (aside / "atlas-records").glob("*.json")
    assert text.strip().splitlines()[-1] == (f"Error: cannot write the record to {out} (No space left on device); it was "
                                             f"saved whole as {saved}: move it into {out} once there is room")
    records.read_record(saved)  # whole, and valid
    assert list(out.iterdir()) == []


# ---- prompt-set files ------------------------------------------------------------------------------


def _write(tmp_path: Path, content: bytes | dict, name: str = "set.json") -> Path:
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else json.dumps(content).encode())
    return path


def test_a_prompt_set_file_is_measured_and_identified_by_its_sha256(model: Path, tmp_path: Path) -> None:
    path = _write(tmp_path, GOOD)
    code, out = measure(model, tmp_path / "out", "--prompt-set", str(path), *TINY)
    assert code == 0, out
    (written,) = (tmp_path / "out").glob("*.json")
    record = records.read_record(written)
    assert record.prompt_set == "my-set" and record.prompt_set_digest == hashlib.sha256(path.read_bytes()).hexdigest()
    assert record.settings.workloads == ["lines", "words"]
    # the export carries the digest with every cell of the record
    db = tmp_path / "atlas.duckdb"
    assert CliRunner().invoke(cli, ["measure", "import", "--db", str(db), "--dir", str(tmp_path / "out")]).exit_code == 0
    result = CliRunner().invoke(cli, ["query", "--db", str(db), "SELECT DISTINCT prompt_set, prompt_set_digest FROM measurement_cells"])
    assert result.output.splitlines()[2].split() == ["my-set", record.prompt_set_digest], result.output


def test_a_bundled_name_on_other_prompts_is_refused(model: Path, tmp_path: Path) -> None:
    bundled = json.loads((Path(run_options.__file__).parents[1] / "records" / "workloads" / PROMPT_SETS["atlas-entropy-v1"]).read_text())
    bundled["workloads"][0]["prompts"][0] += " edited"
    path = _write(tmp_path, bundled)
    code, out = measure(model, tmp_path / "out", "--prompt-set", str(path), *TINY)
    refused_before_loading(code, out, "the set atlas-entropy-v1 is bundled, and this file's sha256")


BAD_FILES = {
    "malformed": (b'{"name": "x", "workloads": [', "is not JSON: Expecting value at line 1 column 29"),
    "non-UTF-8": (json.dumps(GOOD).encode().replace(b"quick", b"qu\xffck"), "is not UTF-8 text (byte"),
    "BOM": (b"\xef\xbb\xbf" + json.dumps(GOOD).encode(), "starts with a UTF-8 byte-order mark"),
    "no workloads": (_set([]), "workloads: List should have at least 1 item"),
    "empty prompt": (_set([{"name": "a", "entropy": "", "prompts": [""]}]), "workloads.0.prompts.0: String should have at least 1 character"),
    "blank prompt": (_set([{"name": "a", "entropy": "", "prompts": [" \n"]}]), "has an empty prompt"),
    "no prompts": (_set([{"name": "a", "entropy": ""}]), "has no prompts"),
    "duplicate names": (_set([{"name": "a", "entropy": "", "prompts": ["x"]}] * 2), "names workload 'a' more than once"),
    "long name": (_set([{"name": "w" * 201, "entropy": "", "prompts": ["x"]}]), "workloads.0.name: String should match pattern"),
    "hostile name": (_set([{"name": "<img src=x onerror=alert(1)>", "entropy": "", "prompts": ["x"]}]),
                     "workloads.0.name: String should match pattern"),
    "newline name": (_set([{"name": "a\nb", "entropy": "", "prompts": ["x"]}]), "String should match pattern"),
    "hostile set name": (_set(GOOD["workloads"], name="x`|<b>"), "name: String should match pattern"),
    "huge generator": (_set([{"name": "a", "entropy": "", "generator": {"kind": "printable-ascii", "seed": 0,
                                                                      "length": 10**9, "count": 1}}]),
                       "workloads.0.generator.length: Input should be less than or equal to 65536"),
    "huge prompt": (_set([{"name": "a", "entropy": "", "prompts": ["x" * 70_000]}]), "workloads.0.prompts.0: String should have at most 65536"),
    "unknown key": ({**GOOD, "promtps": []}, "promtps: Extra inputs are not permitted"),
    "deep nesting": (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_each_fault_of_a_prompt_set_file_is_one_line_before_the_model_loads(model: Path, tmp_path: Path, case: str) -> None:
    content, words = BAD_FILES[case]
    path = _write(tmp_path, content)
    code, out = measure(model, tmp_path / "out", "--prompt-set", str(path), *TINY)
    refused_before_loading(code, out, f"prompt-set file {path}")
    assert words in out, out


def test_a_huge_prompt_set_file_is_refused_unread(model: Path, tmp_path: Path) -> None:
    path = tmp_path / "huge.json"
    with path.open("wb") as fh:  # sparse: no disk, no memory
        fh.truncate(100 * 2**20)
    code, out = measure(model, tmp_path / "out", "--prompt-set", str(path), *TINY)
    refused_before_loading(code, out, f"{path}: {100 * 2**20:,} bytes, over the {MAX_FILE_BYTES:,}-byte limit for a prompt set; not read")


def test_neither_a_bundled_name_nor_a_file_says_both(model: Path, tmp_path: Path) -> None:
    code, out = measure(model, tmp_path / "out", "--prompt-set", "atlas-nope", *TINY)
    refused_before_loading(code, out, "unknown prompt set 'atlas-nope': neither a bundled set (atlas-entropy-v1, atlas-chat-v1, atlas-categories-v1) nor a file")


# ---- draft-vocabulary tables (--draft-vocab) ---------------------------------------------------------


@pytest.fixture(scope="module")
def vocab_model(model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The oracle checkpoint, copied so that each case can put its own draft_vocab.json beside it."""
    return Path(shutil.copytree(model, tmp_path_factory.mktemp("vocab") / "oracle"))


def _table(ids: list, counts: list) -> bytes:
    return json.dumps({"what": "test", "source": "test", "token_ids": ids, "counts": counts}).encode()


def test_a_good_draft_vocabulary_table_is_measured(vocab_model: Path, tmp_path: Path) -> None:
    (vocab_model / "draft_vocab.json").write_bytes(_table([3, 1, 2], [30, 20, 10]))
    code, out = measure(vocab_model, tmp_path / "out", "--workloads", "templated", "--draft-vocab", "2", *TINY)
    assert code == 0, out
    (written,) = (tmp_path / "out").glob("*.json")
    assert records.read_record(written).settings.draft_vocab.size == 2


BAD_TABLES = {
    "Infinity": (b'{"token_ids": [1, 2], "counts": [Infinity, 1]}', "Infinity is not a count"),
    "NaN": (b'{"token_ids": [1, 2], "counts": [NaN, 1]}', "NaN is not a count"),
    "huge float": (b'{"token_ids": [1, 2], "counts": [1e400, 1]}', "token ids and counts must be whole numbers"),
    "fraction": (_table([1, 2], [2.5, 1]), "token ids and counts must be whole numbers"),
    "deep nesting": (b'{"token_ids": ' + b"[" * 100_000 + b"]" * 100_000 + b', "counts": []}', "nested too deeply"),
    "out of order": (_table([1, 2, 3], [10, 20, 30]), "counts must descend (ids ranked by frequency), and count 2 (20) is above count 1 (10)"),
    "negative": (_table([1, 2], [5, -1]), "count -1: every count is at least 1"),
    "zero": (_table([1, 2], [5, 0]), "count 0: every count is at least 1"),
    "lengths": (_table([1, 2, 3], [5, 4]), "3 token ids and 2 counts"),
    "not a table": (b"[1, 2, 3]", "token_ids and counts must be lists"),
    "not JSON": (b"\xff\xfe", "not a draft vocabulary table"),
}


@pytest.mark.parametrize("case", sorted(BAD_TABLES))
def test_each_fault_of_a_draft_vocabulary_table_is_one_line(vocab_model: Path, tmp_path: Path, case: str) -> None:
    content, words = BAD_TABLES[case]
    (vocab_model / "draft_vocab.json").write_bytes(content)
    code, out = measure(vocab_model, tmp_path / "out", "--workloads", "templated", "--draft-vocab", "2", *TINY)
    last = out.strip().splitlines()[-1]
    assert code == 1 and last.startswith(f"Error: {vocab_model / 'draft_vocab.json'}: not a draft vocabulary table ("), out
    assert words in last, out
    assert "Traceback" not in out and not list((tmp_path / "out").glob("*.json"))
