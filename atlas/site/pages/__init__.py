"""Whole pages and the build: module pages (course.py), each model's page and the finder
(modelpage.py, modelfinder.py), each run's page (runpages.py), the Data and Changelog pages
(datapage.py, changelog.py), the evidence file `atlas evidence` writes (write_evidence.py) and the
render and mkdocs build (render.py). A page imports parts; a part never imports a page."""
