"""What pages are made of: escaped Markdown and numbers (mdsafe.py, numbers.py), charts, diagrams,
widgets and the worked round, the closed "More:" boxes (fold.py), the evidence file's format and facts
(evidence_file.py, evidence_format.py), the claim tables (present_claims.py, servable_tables.py,
conformance_table.py, reported.py), the measured rows and charts (measured.py, measured_charts.py),
the MTP forms (mtp_forms.py) and models.json's data (models_json.py, calculator_defaults.py)."""
