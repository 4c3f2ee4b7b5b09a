"""One module per `berth` subcommand, each with `add_parser(subparsers)`; torch is imported only when run."""
