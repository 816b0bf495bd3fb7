"""The site side of the data flow, in two packages: pages/ (whole pages, the evidence file and the build) and
parts/ (what pages are made of: escaped Markdown, charts, tables, the measured rows)."""
