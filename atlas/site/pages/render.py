"""Render: modules/*.md (Jinja-in-Markdown with YAML front matter) + evidence -> site/docs/,
then `mkdocs build --strict` -> site/build/.

Template context (the contract with the course prose):
- `evidence(name)`: an already-escaped Markdown block from evidence/module-NN.evidence.md;
- `facts`: the numbers of that evidence file (empty when the module has none);
- `page`: the module's front matter; `modules`: every module's number, title and path.
Every `{{ expression }}` that is not such a block is escaped as Markdown text on output (the
`finalize` hook), so an id reaching prose through `facts` cannot inject markup either.

Extra pages: any other modules/NAME.md (glossary, how-made) renders to site/docs/NAME.md with
module 8's evidence and facts (the atlas's evidence), e.g. for the snapshot date it was built from.
"""

from __future__ import annotations

import http.server
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import jinja2
import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from atlas import AtlasError
from atlas.site.pages import datapage, runpages
from atlas.site.parts import evidence_file
from atlas.site.pages.course import Course
from atlas.site.parts.mdsafe import Markdown, escape

ATLAS_EVIDENCE_MODULE = 8
_MODULE_NAME = re.compile(r"module-(\d{2})\.md")  # always fullmatch: `$` also matches before a final newline
_FRONT_MATTER = re.compile(r"\A---\n(.*?)\n---\n?", re.S)


class Layout(BaseModel):
    """Where things live, relative to the repository root (overridable for benchmarks/tests)."""

    root: Path
    # Where the files `atlas evidence` generates (module-NN.evidence.md, models.json) are read
    # from, when not the committed evidence/ (`make demo` builds from the ones it wrote under
    # build/, so the committed files stay as they are). Hand-kept files (reported.toml, servable.toml)
    # are always read from evidence/ of root.
    evidence_dir: Path | None = None
    # What `atlas export` wrote (tables, card, manifest, changelog data), for the Data and
    # Changelog pages; default build/data/ of root, and those pages say so when it is absent.
    data_dir: Path | None = None

    @property
    def modules(self) -> Path:
        return self.root / "modules"

    @property
    def evidence(self) -> Path:
        return self.root / "evidence"

    @property
    def module_evidence(self) -> Path:
        return self.evidence_dir or self.evidence

    @property
    def data(self) -> Path:
        return self.data_dir or self.root / "build" / "data"

    @property
    def site(self) -> Path:
        return self.root / "site"

    @property
    def docs(self) -> Path:
        return self.site / "docs"

    @property
    def build(self) -> Path:
        return self.site / "build"


class FrontMatter(BaseModel):
    model_config = ConfigDict(extra="allow")

    number: int
    title: str


class RenderedPage(BaseModel):
    source: Path
    output: Path
    title: str


def split_front_matter(text: str, origin: str) -> tuple[dict[str, Any], str]:
    found = _FRONT_MATTER.match(text)
    if not found:
        raise AtlasError(f"{origin}: no YAML front matter (a '---' block at the top)")
    try:
        meta = yaml.safe_load(found.group(1)) or {}
    except yaml.YAMLError as exc:
        raise AtlasError(f"{origin}: front matter is not valid YAML: {exc}") from None
    if not isinstance(meta, dict):
        raise AtlasError(f"{origin}: front matter must be a mapping")
    return meta, text[found.end():]


def _finalize(value: object) -> str:
    if isinstance(value, Markdown):
        return value
    return escape("" if value is None else value)


def _environment(loader: jinja2.BaseLoader) -> jinja2.Environment:
    # autoescape is for HTML; these templates are Markdown, escaped by `_finalize` instead.
    return jinja2.Environment(
        loader=loader,
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        finalize=_finalize,
        keep_trailing_newline=True,
    )


def _evidence_lookup(ev: evidence_file.Evidence | None, origin: str) -> Callable[[str], Markdown]:
    def evidence(name: str) -> Markdown:
        if ev is None:
            raise AtlasError(f"{origin} asks for evidence({name!r}) but has no evidence file")
        if name not in ev.sections:
            raise AtlasError(
                f"{origin}: unknown evidence section {name!r}; known: "
                + ", ".join(evidence_file.SECTIONS)
            )
        return Markdown(ev.sections[name])

    return evidence


def _render(
    env: jinja2.Environment, source: Path, body: str, context: dict[str, Any]
) -> str:
    try:
        return env.from_string(body).render(**context)
    except jinja2.TemplateSyntaxError as exc:
        raise AtlasError(f"{source}:{exc.lineno}: template syntax error: {exc.message}") from None
    except jinja2.UndefinedError as exc:
        raise AtlasError(f"{source}: {exc.message}") from None


def _page_file(title: str, body: str) -> str:
    return "---\n" + yaml.safe_dump({"title": title}, allow_unicode=True) + "---\n\n" + body


def render_site(layout: Layout) -> list[RenderedPage]:
    """Render every module and extra page into site/docs/. Generated folders are rebuilt whole, so
    a deleted module leaves no stale page behind. A file system that refuses (read-only, full, no
    permission) is one clear error naming the file, not a traceback."""
    try:
        return _render_pages(layout)
    except OSError as exc:
        where = f" ({exc.filename})" if exc.filename else ""
        raise AtlasError(f"cannot render the site into {layout.docs}: {exc.strerror or exc}{where}") from None


def _render_pages(layout: Layout) -> list[RenderedPage]:
    templates = sorted(layout.modules.glob("*.md"))
    sources = [p for p in templates if _MODULE_NAME.fullmatch(p.name)]
    extras = [p for p in templates if not _MODULE_NAME.fullmatch(p.name)]
    if not sources:
        raise AtlasError(f"no module templates (module-NN.md) in {layout.modules}")
    env = _environment(jinja2.BaseLoader())
    parsed: list[tuple[Path, FrontMatter, str]] = []
    for src in sources:
        meta, body = split_front_matter(src.read_text(encoding="utf-8"), str(src))
        try:
            page = FrontMatter.model_validate(meta)
        except ValidationError as exc:
            raise AtlasError(f"{src}: front matter needs number and title: {exc}") from None
        if page.number != int(_MODULE_NAME.fullmatch(src.name).group(1)):  # type: ignore[union-attr]
            raise AtlasError(f"{src}: front matter number {page.number} does not match the file name")
        parsed.append((src, page, body))
    modules = [
        {"number": p.number, "title": p.title, "path": f"modules/{src.name}"}
        for src, p, _ in parsed
    ]

    # diagrams, widgets, reported figures, model pages
    course = Course(layout.evidence, layout.module_evidence)
    out_dir = layout.docs / "modules"
    shutil.rmtree(out_dir, ignore_errors=True)
    out_dir.mkdir(parents=True)
    pages: list[RenderedPage] = []
    atlas_ev: evidence_file.Evidence | None = None
    for src, page, body in parsed:
        ev_path = layout.module_evidence / f"module-{page.number:02d}.evidence.md"
        ev = evidence_file.read(ev_path) if ev_path.exists() else None
        if page.number == ATLAS_EVIDENCE_MODULE:
            atlas_ev = ev
        context = {
            "evidence": _evidence_lookup(ev, str(src)),
            "facts": ev.facts.model_dump() if ev else {},
            "page": page.model_dump(),
            "modules": modules,
            **course.template_helpers(),
        }
        text = _render(env, src, body, context)
        out = out_dir / src.name
        title = f"Module {page.number} — {page.title}"
        out.write_text(_page_file(title, text), encoding="utf-8")
        pages.append(RenderedPage(source=src, output=out, title=title))

    for src in extras:
        meta, body = split_front_matter(src.read_text(encoding="utf-8"), str(src))
        title = str(meta.get("title") or src.stem)
        context = {
            "evidence": _evidence_lookup(atlas_ev, str(src)),
            "facts": atlas_ev.facts.model_dump() if atlas_ev else {},
            "page": meta,
            "modules": modules,
            **course.template_helpers(),
        }
        out = layout.docs / src.name
        out.write_text(_page_file(title, _render(env, src, body, context)), encoding="utf-8")
        pages.append(RenderedPage(source=src, output=out, title=title))
    # one page per measurement run, from the evidence's `runs` section (module 8 links them)
    runs_dir = layout.docs / runpages.RUNS_DIR
    shutil.rmtree(runs_dir, ignore_errors=True)
    if atlas_ev is not None:
        runs_dir.mkdir(parents=True)
        for slug, title, body in runpages.split_run_pages(atlas_ev.sections["runs"]):
            out = runs_dir / f"{slug}.md"
            out.write_text(_page_file(title, body), encoding="utf-8")
            pages.append(RenderedPage(source=layout.module_evidence, output=out, title=title))
    # the Data page first: it ships the record files that the model pages link
    for out in datapage.render(layout.data, layout.evidence, layout.docs):
        pages.append(RenderedPage(source=layout.data, output=out, title=out.stem))
    for out in course.render_model_pages(layout.docs):
        pages.append(RenderedPage(source=layout.evidence / "models.json", output=out, title=out.stem))
    return pages


def mkdocs_build(layout: Layout) -> Path:
    """`mkdocs build --strict` in a subprocess (its own logging, exactly what `make site` runs).
    A build folder that cannot be written is one line here, not mkdocs's traceback."""
    probe = layout.build / ".atlas-write-probe"
    try:
        layout.build.mkdir(parents=True, exist_ok=True)
        probe.write_text("", encoding="utf-8")
        probe.unlink()
    except OSError as exc:
        raise AtlasError(f"cannot write the built site into {layout.build}: {exc.strerror or exc}") from None
    config = layout.site / "mkdocs.yml"
    cmd = [sys.executable, "-m", "mkdocs", "build", "--strict", "--clean",
           "--config-file", str(config), "--site-dir", str(layout.build)]
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-20:])
        raise AtlasError(f"mkdocs build --strict failed:\n{tail}")
    return layout.build


def build(layout: Layout) -> list[RenderedPage]:
    pages = render_site(layout)
    mkdocs_build(layout)
    datapage.add_card(layout.data, layout.build)
    return pages


class SiteHandler(http.server.SimpleHTTPRequestHandler):
    """Files of the built site; a missing page gets the site's own 404.html (with its nav and
    search), as a static host would answer, not Python's bare "Error response" page."""

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        page = Path(self.directory) / "404.html"
        if code != 404 or not page.is_file():
            super().send_error(code, message, explain)
            return
        body = page.read_bytes()
        self.send_response(404, message)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)


def make_server(directory: Path, port: int) -> http.server.ThreadingHTTPServer:
    """The site's server on loopback only (the site needs nothing from the network); port 0 picks one."""
    import functools

    if not (directory / "index.html").exists():
        raise AtlasError(f"no built site in {directory}: run `atlas site build` first")
    handler = functools.partial(SiteHandler, directory=str(directory))
    try:
        return http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
    except OSError as exc:
        raise AtlasError(f"cannot listen on 127.0.0.1:{port}: {exc.strerror}") from None


def serve(directory: Path, port: int) -> None:
    """Serve the built site until Ctrl-C."""
    server = make_server(directory, port)
    print(f"Serving {directory} at http://127.0.0.1:{port}/  (Ctrl-C to stop)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
