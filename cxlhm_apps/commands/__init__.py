"""`cxlhm` subcommands, one module each. A module defines NAME, HELP,
add_arguments(parser) and run(args) -> exit status; cli.py finds them all."""
