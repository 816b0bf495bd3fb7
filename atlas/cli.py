"""The `atlas` command line. Each command imports its module lazily so `atlas --help` stays fast
(torch and transformers load only for the commands that need them)."""

from __future__ import annotations

import sys

import click

from atlas import AtlasError, __version__


class AtlasGroup(click.Group):
    """Print AtlasError as a one-line message and exit 1, instead of a traceback."""

    def invoke(self, ctx: click.Context):  # type: ignore[override]
        try:
            return super().invoke(ctx)
        except AtlasError as exc:
            click.secho(f"Error: {exc}", fg="red", err=True)
            sys.exit(1)


@click.group(cls=AtlasGroup)
@click.version_option(__version__, prog_name="atlas")
def cli() -> None:
    """MTP Atlas: crawl model configs, measure self-speculative decoding, render the course site."""


# ---- crawl (hub -> store) -------------------------------------------------------------------


# ---- measure (team model, self-speculative decoding, records) ---------------------------------


# ---- evidence and site (store -> evidence -> site) ---------------------------------------------


@cli.command("evidence")
@click.option("--db", type=click.Path(dir_okay=False), envvar="ATLAS_DB",
              default="data/atlas.duckdb", show_default=True, help="The atlas store (DuckDB).")
@click.option("--out", type=click.Path(dir_okay=False),
              default="evidence/module-08.evidence.md", show_default=True)
@click.option("--servable", "servable_path", type=click.Path(dir_okay=False),
              default="evidence/servable.toml", show_default=True,
              help="The dated, cited support matrix joined to the models.")
def evidence_cmd(db: str, out: str, servable_path: str) -> None:
    """Run the named evidence queries against the store and write the module 8 evidence file."""
    from pathlib import Path

    from atlas import evidence

    ev = evidence.generate(Path(db), Path(out), Path(servable_path))
    f = ev.facts
    click.echo(
        f"Wrote {out}: snapshot {f.snapshot_id} ({f.snapshot_date}), {f.n_models} models, "
        f"{f.n_declaring} declare MTP, {f.n_mismatches} mismatches, "
        f"{f.n_measurements} measured cells."
    )


@cli.group("site")
def site_group() -> None:
    """Render the course pages and build or serve the static site."""


@site_group.command("build")
def site_build() -> None:
    """Render modules/ + evidence/ into site/docs/, then `mkdocs build --strict` into site/build/."""
    from pathlib import Path

    from atlas import render

    layout = render.Layout(root=Path.cwd())
    pages = render.build(layout)
    click.echo(f"Rendered {len(pages)} pages; built {layout.build}/ (mkdocs build --strict).")


@site_group.command("serve")
@click.option("--port", type=int, default=8000, show_default=True)
def site_serve(port: int) -> None:
    """Serve site/build/ on http://127.0.0.1:PORT/ (loopback only)."""
    from pathlib import Path

    from atlas import render

    render.serve(render.Layout(root=Path.cwd()).build, port)


if __name__ == "__main__":
    cli()
