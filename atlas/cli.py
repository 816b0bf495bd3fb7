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


if __name__ == "__main__":
    cli()
