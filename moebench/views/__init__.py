"""Views of a result: terminal tables, Markdown, the pull-request paste, CSV, plots, the
comparison of two runs. They format; every number they show comes from the analysis stage."""
