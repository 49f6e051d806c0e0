"""``blis-simpy report``: figures and one HTML page from results files, timelines, sweep
datasets and plan results (docs/planning.md, "Reports"). Never imports the CLI."""
