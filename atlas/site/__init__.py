"""The site side of the data flow: evidence queries, charts, Markdown escaping and the mkdocs build."""
