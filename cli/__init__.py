"""The command line on top of the client library (client/): one module per group of commands, each
adding its subcommands to starter.py's parser."""
