"""optimum-cli subcommands of optimum-executorch (argument parsing only)."""
