"""The `ragtune` command line: thin Typer commands over the stages, and its rich tables."""
