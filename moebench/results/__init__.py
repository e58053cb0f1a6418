"""Stage 5: RunResult schema, save/load, and the views of a result (tables, CSV, Markdown, plots, compare)."""
