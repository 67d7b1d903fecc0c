"""One module per ``rankstream`` subcommand: ``add_arguments(parser)`` and ``run(args) -> int``."""
