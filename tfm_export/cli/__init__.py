"""Command-line entry points: thin layers that parse, call one library function and print."""
