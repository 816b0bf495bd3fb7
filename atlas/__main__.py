from atlas.cli import cli

cli()
